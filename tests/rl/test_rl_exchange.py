"""rl/ranks/exchange.py (with RoC and advantages on the rollout hosts: `host_selection.select_on_host`,
and `step_summary.py`'s merge): each rank receives only its training shard, and N nodes select,
train and log exactly what one node does.

Several nodes and ranks are simulated by threads of one process: `rl_dist`'s two object
collectives are replaced by a barrier-synchronised exchange that also counts the bytes each rank
receives (a rank never receives from itself). The reference is the single-process run, where the
collectives are the identity.
"""
from __future__ import annotations

import pickle
import random
import threading

import numpy as np
import pytest

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.ranks.exchange import HostFailure, HostSelection, StepFailed, exchange, pack, plan_shards, unpack
from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rl.selection.host_selection import GradedBatch, select_on_host
from rstar2_cli.rl.ranks.rollout_hosts import node_shard
from rstar2_cli.rl.selection.step_summary import step_columns
from rstar2_cli.rollout.trajectory import Trajectory


def _cfg(group_size: int = 4, mini_batches: int = 2):
    return load_recipe_dict({"model": {"path": "m"}, "data": {"train": "t.jsonl"},
                             "train": {"group_size": group_size, "seed": 7, "ppo_mini_batches": mini_batches},
                             "roc": {"enabled": True, "mode": "paper", "oversample": 2}})


def _trajectory(pos: int, sample: int, max_len: int = 200) -> Trajectory:
    """A graded trajectory of prompt position `pos`, the same whoever builds it."""
    rng = random.Random(pos * 1000 + sample)
    n = rng.randint(5, max_len)
    calls = rng.randint(0, 3)
    return Trajectory(prompt_id=f"q{pos % 5}", sample_index=sample, group_index=pos,
                      prompt_ids=[rng.randrange(1000) for _ in range(7)],
                      response_ids=[rng.randrange(150_000) for _ in range(n)],
                      loss_mask=[int(i % 9 != 3) for i in range(n)],
                      logprobs=[] if sample == 1 else [-rng.random() for _ in range(n)],
                      text="x " * n + "<answer>1</answer>" * rng.randint(0, 2), reward=float(rng.random() < 0.4),
                      num_turns=calls + 1, num_tool_calls=calls, num_tool_errors=min(calls, rng.randint(0, 1)),
                      tool_time=0.25 * calls, finish_reason=rng.choice(["stop", "length"]))


def _piece(positions, per_prompt, max_len=200):
    trajs = [_trajectory(p, s, max_len) for p in positions for s in range(per_prompt)]
    return list(positions), trajs, {"time/rollout": 1.0 + len(positions), "time/reward": 0.5}


def _select(piece, node, cfg, index=3) -> HostSelection:
    """Steps 4-5 on a rollout host: the step's own call."""
    _, trajs, seconds = piece
    return select_on_host(GradedBatch(trajs, len(trajs), seconds), cfg, index=index, node=node)


def _columns(shard):
    return {k: v for k, v in step_columns(4, shard.summaries, {}, StepTimer()).items()
            if k != "time/step" and not k.startswith("rollout/trajectories_node")}


class ThreadWorld:
    """`broadcast_from_each` and `scatter_objects` across threads, one thread per rank."""

    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size)
        self.slots: list = [None] * world_size
        self.received = [0] * world_size
        self.local = threading.local()

    def broadcast_from_each(self, obj, sources):
        rank = self.local.rank
        self.slots[rank] = obj
        self.barrier.wait()
        out = [self.slots[s] for s in sources]
        self.received[rank] += sum(len(pickle.dumps(self.slots[s])) for s in sources if s != rank)
        self.barrier.wait()
        return out

    def scatter_objects(self, per_rank, src):
        rank = self.local.rank
        if rank == src:
            self.slots[src] = per_rank
        self.barrier.wait()
        everyone = self.slots[src]
        if rank != src:     # scatter_object_list pads every rank's part to the largest
            self.received[rank] += max(len(pickle.dumps(p)) for p in everyone)
        mine = everyone[rank]
        self.barrier.wait()
        return mine


def _run(cfg, prompts: int, nodes: int, per_node: int, monkeypatch, max_len: int = 200):
    """Selection and exchange on nodes x per_node simulated ranks; (each rank's StepShard, bytes each received)."""
    world = nodes * per_node
    fake = ThreadWorld(world)
    monkeypatch.setattr(rl_dist, "broadcast_from_each", fake.broadcast_from_each)
    monkeypatch.setattr(rl_dist, "scatter_objects", fake.scatter_objects)
    host_ranks = [n * per_node for n in range(nodes)]
    out: list = [None] * world

    def rank_main(rank: int):
        fake.local.rank = rank
        node, is_host = rank // per_node, rank % per_node == 0
        mine = (_select(_piece(node_shard(prompts, node, nodes), cfg.rollouts_per_prompt, max_len), node, cfg)
                if is_host else None)
        out[rank] = exchange(mine, host_ranks, rank, world, cfg.train.ppo_mini_batches)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(s is not None for s in out)
    return out, fake.received


def _rows(shard):
    return [((t.prompt_id, t.sample_index, tuple(t.response_ids), tuple(t.logprobs)), a, m)
            for t, a, m in zip(shard.trajectories, shard.advantages, shard.mini_batches)]


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (3, 1), (2, 3)])
def test_n_nodes_select_and_train_exactly_what_one_node_does(nodes, per_node, monkeypatch):
    cfg, prompts = _cfg(), 11
    one = exchange(_select(_piece(range(prompts), cfg.rollouts_per_prompt), 0, cfg), [0], 0, 1,
                   cfg.train.ppo_mini_batches)
    assert 0 < one.kept < prompts * cfg.rollouts_per_prompt
    shards, _ = _run(cfg, prompts, nodes, per_node, monkeypatch)
    # the same trajectories, advantages and mini-batches over the ranks (RoC seeded per group)
    assert sorted(r for s in shards for r in _rows(s)) == sorted(_rows(one))
    assert all(s.kept == one.kept for s in shards)
    # the metrics of the whole batch, on every rank, equal one host's (but time/rollout: the slowest host's)
    expected = _columns(one)
    for s in shards:
        got = step_columns(4, s.summaries, {}, StepTimer())
        per_node = [v for k, v in got.items() if k.startswith("rollout/trajectories_node")]
        assert sum(per_node) == prompts * cfg.rollouts_per_prompt
        slowest = ("time/rollout", "throughput/rollout_tokens_per_s")
        assert {k: v for k, v in _columns(s).items() if k not in slowest} == pytest.approx(
            {k: v for k, v in expected.items() if k not in slowest})
        assert got["time/reward"] == 0.5


def test_each_rank_receives_at_most_a_2_world_size_th_of_what_every_rank_received_before(monkeypatch):
    """Before, every rank received every host's pickled trajectories (`broadcast_object_list` of
    each host's piece); now the hosts' summaries and its own shard of the kept half, as arrays:
    under 1 / (2 x world size) of it (benchmarks/timing/bench_exchange.py: the stage-2 shapes)."""
    cfg, prompts, nodes, per_node, max_len = _cfg(group_size=8, mini_batches=1), 16, 2, 4, 1500
    old = sum(len(pickle.dumps(_piece(node_shard(prompts, n, nodes), cfg.rollouts_per_prompt, max_len)))
              for n in range(nodes))
    _, received = _run(cfg, prompts, nodes, per_node, monkeypatch, max_len)
    assert max(received) * 2 * nodes * per_node <= old, (received, old)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("mini_batches", [1, 2, 3])
def test_every_world_size_trains_the_one_rank_mini_batches_for_any_kept_count(world_size, mini_batches):
    rng = random.Random(world_size * 10 + mini_batches)
    for kept in range(0, 23):
        lengths = [rng.randint(1, 12_000) for _ in range(kept)]
        plan = plan_shards(lengths, world_size, mini_batches)
        one = [set(c.tolist()) for c in np.array_split(np.arange(kept), mini_batches)]   # PolicyTrainer's split
        assert [{i for s in plan for i, m in s if m == b} for b in range(mini_batches)] == one
        assert sorted(i for s in plan for i, _ in s) == list(range(kept))
        for b in range(mini_batches):          # tokens balanced within each optimizer step
            load = [sum(lengths[i] for i, m in s if m == b) for s in plan]
            assert max(load) - min(load) <= max((lengths[i] for i in one[b]), default=0)


def test_the_old_interleaved_split_trains_other_mini_batches_when_the_count_does_not_divide():
    """What the plan replaces: items r::W per rank, each rank's list then split in two; with 6
    kept on 4 ranks the first optimizer step takes items {0, 1, 2, 3}, one rank takes {0, 1, 2}."""
    kept, world = 6, 4
    old = [set() for _ in range(2)]
    for r in range(world):
        for b, c in enumerate(np.array_split(np.arange(kept)[r::world], 2)):
            old[b] |= set(c.tolist())
    assert old[0] != set(range(3))
    assert {i for s in plan_shards([5] * kept, world, 2) for i, m in s if m == 0} == set(range(3))


def test_a_shard_travels_as_arrays_and_comes_back_as_the_trajectories_the_update_reads():
    ts = [_trajectory(0, s) for s in range(3)]
    payload = pack([(i, i % 2, t, 0.5 - i) for i, t in enumerate(ts)])
    assert {type(v) for k, v in payload.items() if k != "label"} == {np.ndarray}
    back = unpack(pickle.loads(pickle.dumps(payload)))
    assert [(i, m, a) for i, m, _, a in back] == [(0, 0, 0.5), (1, 1, -0.5), (2, 0, -1.5)]
    for (_, _, t, _), orig in zip(back, ts):
        assert (t.prompt_ids, t.response_ids, t.loss_mask) == (orig.prompt_ids, orig.response_ids, orig.loss_mask)
        assert t.logprobs == pytest.approx(orig.logprobs, rel=1e-6) and len(t.logprobs) == len(orig.logprobs)


def test_a_failed_host_fails_the_step_on_every_rank(monkeypatch):
    """A host's failure travels as a `HostFailure` in place of its summary; every rank raises it."""
    world = ThreadWorld(3)
    monkeypatch.setattr(rl_dist, "broadcast_from_each", world.broadcast_from_each)
    monkeypatch.setattr(rl_dist, "scatter_objects", world.scatter_objects)
    cfg, errors = _cfg(), [None] * 3

    def rank_main(rank):
        world.local.rank = rank
        mine = {0: _select(_piece([0], 4), 0, cfg), 1: HostFailure(1, "RuntimeError('boom')"), 2: None}[rank]
        try:
            exchange(mine, [0, 1], rank, 3, 1)
        except StepFailed as e:
            errors[rank] = str(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == ["rollout failed on node 1: RuntimeError('boom')"] * 3
