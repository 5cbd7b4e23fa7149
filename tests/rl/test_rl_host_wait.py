"""Ranks that wait for the rollout hosts: a rollout longer than the collective timeout does not
time them out while the hosts are alive, and a host that died is reported in bounded time, in one
line (`rl/ranks/dist.py`: heartbeats and readiness marks in torch.distributed's store).

Two real processes per case (gloo on CPU, the store of `init_process_group`), with a collective
timeout of 2 s and heartbeats every 0.1 s, silent after 3 s (`rl_wait_worker.py`)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("rl_wait_worker.py")
SCENARIOS = ("slow", "dead", "store_gone")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, dict[int, dict]]:
    """Every scenario's two ranks, all started at once: {scenario: {rank: what it wrote}}."""
    out = tmp_path_factory.mktemp("wait")
    procs = []
    for scenario in SCENARIOS:
        port = _port()
        for rank in (0, 1):
            env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                       LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, str(WORKER), scenario, str(out)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=120)[0] for p in procs]
    found: dict[str, dict[int, dict]] = {s: {} for s in SCENARIOS}
    for scenario in SCENARIOS:
        for rank in (0, 1):
            f = out / f"{scenario}_rank{rank}.json"
            if f.is_file():
                found[scenario][rank] = json.loads(f.read_text())
    found["logs"] = logs   # type: ignore[assignment]
    return found


def test_a_rollout_longer_than_the_collective_timeout_still_reaches_the_waiting_rank(ranks):
    waiting = ranks["slow"].get(1)
    assert waiting is not None and "error" not in waiting, (waiting, ranks["logs"][1][-3000:])
    assert waiting["got"] == ["rolled out"] and waiting["seconds"] > 4.5    # waited past the 2 s timeout
    assert ranks["slow"][0]["got"] == ["rolled out"]
    # the gather to rank 0 (validation's): rank 0 waited 3 s for rank 1's share, past the timeout too
    assert ranks["slow"][0]["gathered"] == ["share of 0", "share of 1"] and ranks["slow"][1]["gathered"] is None


def test_a_host_that_died_is_reported_within_the_bound_in_one_line(ranks):
    waiting = ranks["dead"].get(0)
    assert waiting is not None and "error" in waiting, (waiting, ranks["logs"][2][-3000:])
    assert 1 not in ranks["dead"]                                # the host exited without a result
    message = waiting["error"]
    assert "\n" not in message and "rank 1" in message and "heartbeat" in message, message
    assert waiting["seconds"] < 0.5 + 3.0 + 2.0                  # death + silence bound + polling slack


def test_losing_the_store_with_rank_0_is_reported_in_one_line(ranks):
    waiting = ranks["store_gone"].get(1)
    assert waiting is not None and "error" in waiting, (waiting, ranks["logs"][5][-3000:])
    message = waiting["error"]
    assert "\n" not in message and "store" in message, message
    assert waiting["seconds"] < 0.5 + 3.0 + 2.0


class DictStore:
    """The part of torch.distributed's `Store` that `Liveness` uses (the names are checked against
    the installed torch in test_rl_dist.py), in a dict; `clone` shares the dict as a client of the
    same store does."""

    def __init__(self):
        self.values: dict[str, bytes] = {}

    def set(self, key, value):
        self.values[key] = str(value).encode()

    def add(self, key, amount):
        self.values[key] = str(int(self.values.get(key, b"0")) + amount).encode()
        return int(self.values[key])

    def multi_get(self, keys):
        return [self.values[k] for k in keys]

    def clone(self):
        return self

    def set_timeout(self, timeout):
        pass


def test_the_wait_lasts_while_the_source_beats_and_ends_silent_s_after_its_last_beat():
    """On the waiting rank's clock: a source that beats for 500 s and then marks itself ready is
    waited for all along; one that beats until t = 30 s and then goes silent is lost once
    silent_s = 10 s have passed without a beat (within two polls), never before. (The real beat
    threads sleep 5 s of wall time first: the test's beats are the clock's.)"""
    from rstar2_cli.rl.ranks.liveness import Liveness, RankLost

    def world(beats_until, ready_at):
        store, now = DictStore(), [0.0]
        waiter = Liveness(store, 0, beat_s=5.0, silent_s=10.0, poll_s=1.0, clock=lambda: now[0],
                          sleep=lambda s: tick(s)).start()
        source = Liveness(store, 1, beat_s=5.0, silent_s=10.0, poll_s=1.0).start()

        def tick(seconds):                          # the source's life while the waiter sleeps: a beat a second
            for _ in range(max(1, round(seconds * 10))):
                tenths[0] += 1
                now[0] = tenths[0] / 10
                if tenths[0] % 10 == 0 and now[0] <= beats_until:
                    store.add("rstar2/liveness/beat/1", 1)
                if ready_at is not None and now[0] >= ready_at:
                    source.ready(1)
        tenths = [0]
        return waiter, now

    waiter, now = world(beats_until=1e9, ready_at=500.0)
    waiter.wait([0, 1], 1, "waiting for ranks [0, 1]")
    assert 500.0 <= now[0] < 501.5

    waiter, now = world(beats_until=30.0, ready_at=None)
    with pytest.raises(RankLost) as lost:
        waiter.wait([1], 1, "waiting for ranks [1]")
    assert 40.0 < now[0] <= 42.0       # the last beat seen within a poll, the silence found within another
    assert re.fullmatch(r"waiting for ranks \[1\]: rank 1 sent no heartbeat for 1[01] s \(silent after 10 s\): "
                        r"its process died or its node is unreachable", str(lost.value)), str(lost.value)
