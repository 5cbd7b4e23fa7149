"""The step's exchange: each rank receives exactly the trajectories it trains, as flat arrays.

Why: at paper scale a step rolls out 512 prompts x 32 trajectories of up to 12K tokens on 8
nodes and trains on 64 ranks. Sending every trajectory to every rank (each then unpickling ~100M
tokens as Python lists) costs gigabytes of heap and seconds of CPU per rank, where each rank
trains on 1/64 of the kept half. So (`exchange`, a collective every rank calls):

  1. each rollout host has selected over its own node-shard (RoC and the advantages ran there,
     `trainer.py`) and broadcasts its small summary (over the gloo group, `rl/ranks/dist.py`): the kept
     groups' prompt positions and token lengths, and its metric tallies (`step_summary.py`);
     a host whose part of the step failed sends a `HostFailure` instead, and every rank raises;
  2. every rank plans the same shards from those lengths (`plan_shards`, `Plan`);
  3. each host scatters to every rank only that rank's kept trajectories (`pack`: token ids, loss
     mask, engine log-probs, advantages); a rank rebuilds its trajectories from them (`unpack`).

`benchmarks/timing/bench_exchange.py` measures the bytes a rank receives.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostFailure:
    """Why a rollout host's part of the step failed: sent in place of its summary, raised on every rank."""
    node: int
    error: str

    def __str__(self) -> str:
        return f"node {self.node}: {self.error}"


class StepFailed(RuntimeError):
    """A rollout host's part of the step failed (the message names the node and the error)."""


class HostFailures:
    """`with HostFailures(node) as caught:` around a rollout host's part of the step. Distributed,
    an exception there is logged and kept as `caught.failure`, for the exchange to carry to every
    rank (so no rank waits for a host that gave up); in a single process it propagates."""

    def __init__(self, node: int):
        self.node, self.failure = node, None

    def __enter__(self) -> HostFailures:
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if not isinstance(error, Exception) or not rl_dist.is_distributed():
            return False
        log.exception("this node's part of the step failed")
        self.failure = HostFailure(self.node, repr(error))
        return True


@dataclass
class HostSelection:
    """What a rollout host selected to train: its kept trajectories in RoC's order (whole groups),
    their advantages, and its summary (anything with `groups`: [(prompt position, member token
    lengths)] of the kept groups in that order; `step_summary.HostSummary`)."""
    kept: list[Trajectory]
    advantages: list[float]
    summary: Any


@dataclass
class StepShard:
    """This rank's part of the step, and every host's summary (node order)."""
    trajectories: list[Trajectory]                   # this rank's, in the global kept order
    advantages: list[float]
    mini_batches: list[int]                          # the global mini-batch of each
    kept: int                                        # trajectories kept, over all ranks
    summaries: list[Any]


def plan_shards(lengths: Sequence[int], world_size: int, mini_batches: int) -> list[list[tuple[int, int]]]:
    """Per rank, the (global kept index, mini-batch) pairs it trains, by index.

    The mini-batches are one rank's: `np.array_split` of the kept order into `mini_batches`
    (`PolicyTrainer.update` without a plan). Each mini-batch is spread over the ranks by tokens
    (longest first, each to the rank with the fewest tokens of that mini-batch so far; ties to the
    lower rank), so every optimizer step sees exactly the 1-rank mini-batch for any kept count and
    world size, and no rank waits on another's longer share by more than one trajectory."""
    if world_size < 1 or mini_batches < 1:
        raise ValueError(f"world_size={world_size}, mini_batches={mini_batches}: both must be >= 1")
    out: list[list[tuple[int, int]]] = [[] for _ in range(world_size)]
    for m, chunk in enumerate(np.array_split(np.arange(len(lengths)), mini_batches)):
        load = [0] * world_size
        for i in sorted(chunk.tolist(), key=lambda i: (-lengths[i], i)):
            r = min(range(world_size), key=lambda r: (load[r], r))
            load[r] += lengths[i]
            out[r].append((i, m))
    return [sorted(s) for s in out]


class Plan:
    """Which rank trains which kept trajectory, the same on every rank (from the summaries alone).

    The global kept order is one host's: the kept groups by prompt position, each in its order."""

    def __init__(self, summaries: Sequence[Any], world_size: int, mini_batches: int):
        self.world_size = world_size
        order = sorted((pos, h, j) for h, s in enumerate(summaries) for j, (pos, _) in enumerate(s.groups))
        self.lengths: list[int] = []
        self.index: dict[tuple[int, int, int], int] = {}    # (host, its kept group, member) -> global index
        for _, h, j in order:
            for member, n in enumerate(summaries[h].groups[j][1]):
                self.index[(h, j, member)] = len(self.lengths)
                self.lengths.append(n)
        self.summaries = summaries
        self.rank_of = {i: (r, m) for r, shard in enumerate(plan_shards(self.lengths, world_size, mini_batches))
                        for i, m in shard}

    def payloads(self, host: int, kept: Sequence[Trajectory], advantages: Sequence[float]) -> list[dict[str, Any]]:
        """Host `host`'s kept trajectories (in its RoC order) packed per rank, rank by rank."""
        per_rank: list[list] = [[] for _ in range(self.world_size)]
        k = 0
        for j, (_, members) in enumerate(self.summaries[host].groups):
            for member in range(len(members)):
                i = self.index[(host, j, member)]
                r, m = self.rank_of[i]
                per_rank[r].append((i, m, kept[k], advantages[k]))
                k += 1
        return [pack(rows) for rows in per_rank]


def _mask(t: Trajectory) -> list[int]:
    if any(m not in (0, 1) for m in t.loss_mask):
        raise ValueError(f"trajectory {t.prompt_id}#{t.sample_index}: loss_mask holds a value other than 0 and 1")
    return t.loss_mask


def pack(items: Sequence[tuple[int, int, Trajectory, float]]) -> dict[str, Any]:
    """(global index, mini-batch, trajectory, advantage) rows as flat arrays (what a rank trains on)."""
    ts = [t for _, _, t, _ in items]
    full = [len(t.logprobs) == len(t.response_ids) for t in ts]

    def flat(rows: list[list], dtype) -> np.ndarray:
        return np.concatenate([np.asarray(r, dtype=dtype) for r in rows]) if rows else np.zeros(0, dtype)

    return {"index": np.array([i for i, _, _, _ in items], np.int64),
            "mini_batch": np.array([m for _, m, _, _ in items], np.int32),
            "advantage": np.array([a for _, _, _, a in items], np.float64),
            "prompt_len": np.array([len(t.prompt_ids) for t in ts], np.int32),
            "response_len": np.array([len(t.response_ids) for t in ts], np.int32),
            "tokens": flat([list(t.prompt_ids) + list(t.response_ids) for t in ts], np.int32),
            "loss_mask": flat([_mask(t) for t in ts], np.uint8),
            "has_logprobs": np.array(full, bool),
            "logprobs": flat([t.logprobs for t, f in zip(ts, full) if f], np.float32),
            "label": [(t.prompt_id, t.sample_index) for t in ts]}


def unpack(payload: dict[str, Any]) -> list[tuple[int, int, Trajectory, float]]:
    """`pack`'s rows back, the trajectories holding what `PolicyTrainer.update` reads."""
    out, tok, resp, lp = [], 0, 0, 0
    for k, (prompt_id, sample) in enumerate(payload["label"]):
        p, r = int(payload["prompt_len"][k]), int(payload["response_len"][k])
        ids = payload["tokens"][tok:tok + p + r].tolist()
        logprobs: list[float] = []
        if payload["has_logprobs"][k]:
            logprobs, lp = payload["logprobs"][lp:lp + r].tolist(), lp + r
        t = Trajectory(prompt_id=prompt_id, sample_index=sample, prompt_ids=ids[:p], response_ids=ids[p:],
                       loss_mask=payload["loss_mask"][resp:resp + r].tolist(), logprobs=logprobs)
        tok, resp = tok + p + r, resp + r
        out.append((int(payload["index"][k]), int(payload["mini_batch"][k]), t, float(payload["advantage"][k])))
    return out


def exchange(mine: HostSelection | HostFailure | None, host_ranks: Sequence[int], rank: int, world_size: int,
             mini_batches: int) -> StepShard:
    """Every rank: the hosts' summaries, and this rank's trajectories to train (module docstring).
    `mine`: this host's selection, or its failure; None on ranks that are not rollout hosts.
    Raises `StepFailed` on every rank if any host failed."""
    sent = mine.summary if isinstance(mine, HostSelection) else mine
    summaries = rl_dist.broadcast_from_each(sent, list(host_ranks))
    failures = [s for s in summaries if isinstance(s, HostFailure)]
    if failures:
        raise StepFailed(f"rollout failed on {failures[0]}")
    plan = Plan(summaries, world_size, mini_batches)
    rows: list[tuple[int, int, Trajectory, float]] = []
    for h, src in enumerate(host_ranks):
        payloads = plan.payloads(h, mine.kept, mine.advantages) if rank == src else None
        rows += unpack(rl_dist.scatter_objects(payloads, src))
    rows.sort(key=lambda row: row[0])
    return StepShard(trajectories=[r[2] for r in rows], advantages=[r[3] for r in rows],
                     mini_batches=[r[1] for r in rows], kept=len(plan.lengths), summaries=summaries)
