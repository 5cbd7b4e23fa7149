"""Whether the ranks another rank waits for are alive: heartbeats and readiness marks in
torch.distributed's key-value store (the one `init_process_group` met on: torchrun's agent store
on the head node, or rank 0's TCPStore without torchrun).

Every rank, from `rl_dist.setup_distributed` on, adds 1 to its beat key every `beat_s` seconds
from a daemon thread, on its own clone of the store (`Store.clone`: one client per thread).
Before a collective in which ranks may wait long for a few sources (the rollout hosts' pieces of
a step, their shares of the held-out eval: `rl_dist.broadcast_from_each`, `rl_dist.gather_from`),
each source sets its ready key to the collective's number and every other rank polls the store
until each source is ready, and only then enters the collective. A source whose beat has not
changed for `silent_s` seconds, on the waiting rank's own clock (no clocks are compared across
nodes), counts as dead: `RankLost`, one line. A store that stops answering (its process gone, the
connection closed) is `RankLost` too. So the collective starts with every source there, and its
own timeout bounds the transfer only, never the rollout before it.

A beat is late when its thread does not run: the main thread holding the GIL in one long call, a
stop-the-world pause, a slow store. `silent_s` is many beats long for that reason.
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "rstar2/liveness"


class RankLost(RuntimeError):
    """A rank this one waited for stopped beating, or the store is gone (one-line message)."""


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0]


def _key(kind: str, rank: int) -> str:
    return f"{PREFIX}/{kind}/{rank}"


class Liveness:
    """This rank's heartbeat and its waits for others (module docstring). `store`: a
    torch.distributed `Store`; `poll_s`: the longest pause between two looks at the store
    (the first looks come faster, so a source that is nearly ready costs milliseconds)."""

    def __init__(self, store: Any, rank: int, *, beat_s: float, silent_s: float, poll_s: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        if not 0 < beat_s < silent_s or poll_s <= 0:
            raise ValueError(f"heartbeat every {beat_s} s, silent after {silent_s} s, poll {poll_s} s: "
                             f"need 0 < beat < silent and poll > 0")
        self.store, self.rank, self.beat_s, self.silent_s, self.poll_s = store, rank, beat_s, silent_s, poll_s
        self.clock, self.sleep = clock, sleep

    def start(self) -> "Liveness":
        """Publish this rank's keys (one beat; ready for nothing yet) and start beating. Every rank
        calls it before a collective of all ranks, so once that returns every key exists."""
        self.store.set(_key("ready", self.rank), "0")
        self.store.add(_key("beat", self.rank), 1)
        waits = self.store.clone()   # the waits' own client: a call unanswered for silent_s is a lost store
        waits.set_timeout(datetime.timedelta(seconds=self.silent_s))
        beats, self.store = self.store.clone(), waits
        threading.Thread(target=self._beat, args=(beats,), name="rstar2-heartbeat", daemon=True).start()
        return self

    def _beat(self, store: Any) -> None:
        key = _key("beat", self.rank)
        while True:
            time.sleep(self.beat_s)
            try:
                store.add(key, 1)
            except Exception as e:   # the store is gone: the waits report it; nothing left to beat to
                log.warning("heartbeat stopped: the store does not answer (%s: %s)", type(e).__name__, _first_line(e))
                return

    def ready(self, number: int) -> None:
        """This rank is ready for collective `number`."""
        self.store.set(_key("ready", self.rank), str(number))

    def wait(self, ranks: Sequence[int], number: int, what: str) -> None:
        """Return once every rank in `ranks` (this one aside) is ready for collective `number`;
        `RankLost` naming `what` if one of them stays silent for `silent_s`, or the store fails."""
        pending = sorted(set(ranks) - {self.rank})
        started = self.clock()
        seen: dict[int, tuple[bytes | None, float]] = {r: (None, started) for r in pending}
        pause = min(0.005, self.poll_s)
        while pending:
            try:
                values = self.store.multi_get([k for r in pending for k in (_key("ready", r), _key("beat", r))])
            except Exception as e:
                raise RankLost(f"{what}: the store that holds the heartbeats does not answer ({type(e).__name__}: "
                               f"{_first_line(e)}): the process that serves it (torchrun's agent on the head node, "
                               f"or rank 0) is gone or unreachable") from None
            now = self.clock()
            still = []
            for i, r in enumerate(pending):
                if int(values[2 * i]) >= number:
                    continue
                beat = values[2 * i + 1]
                if beat != seen[r][0]:
                    seen[r] = (beat, now)
                elif now - seen[r][1] > self.silent_s:
                    raise RankLost(f"{what}: rank {r} sent no heartbeat for {now - seen[r][1]:.0f} s (silent after "
                                   f"{self.silent_s:g} s): its process died or its node is unreachable")
                still.append(r)
            pending = still
            if pending:
                self.sleep(pause)
                pause = min(2 * pause, self.poll_s)
