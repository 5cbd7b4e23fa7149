"""A step's selection where its trajectories are, and each rank's training shard, as arrays.

Why: at paper scale a step rolls out 512 prompts x 32 trajectories of up to 12K tokens on 8
nodes and trains on 64 ranks. Sending every trajectory to every rank (each then unpickling ~100M
tokens as Python lists) costs gigabytes of heap and seconds of CPU per rank, where each rank
trains on 1/64 of the kept half. So (`share_step`, a collective every rank calls):

  1. each rollout host selects over its own node-shard (whole groups: a node rolls out every
     sample of its prompts): its trajectories get their place in the batch (`group_index`, the
     prompt position), then RoC (`rl/roc.py`) and the group advantages run there;
  2. the hosts broadcast a small summary (over the gloo group, `rl/dist.py`): the tallies of the
     step's metrics (`metrics.Tally`, merged into exactly the values one host holding the whole
     batch would log), the kept groups' positions and token lengths, their timings;
  3. every rank plans the same shards from those lengths (`plan_shards`), and each host scatters
     to every rank only that rank's kept trajectories, as flat arrays (token ids, loss mask,
     engine log-probs, advantages); a rank rebuilds its trajectories from them.

RoC's random choices are drawn per group, from a generator seeded by the run's seed, the step and
the group's prompt position (`group_rng`): the selection is the same whichever host makes it, so
N nodes reproduce one node. `benchmarks/timing/bench_exchange.py` measures the bytes a rank receives.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.metrics import Tally, rollout_tally
from rstar2_cli.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)

# What a rollout host produces for one batch: (positions of its node-shard in the batch,
# trajectories graded, {"time/rollout": s, "time/reward": s}); None on ranks that are not hosts.
Piece = tuple[list[int], list[Trajectory], dict[str, float]]
# A hook of the rollout source between placement and RoC: (kept trajectories, its per-host report)
Filter = Callable[[list[Trajectory]], tuple[list[Trajectory], Any]]


@dataclass
class Rolled:
    """A step's batch as a source hands it over: this host's piece (a string: why its rollout
    failed; None off-host) and a filter the host runs on it before RoC."""
    piece: Piece | str | None
    keep: Filter | None = None


def group_rng(seed: int, step: int) -> Callable[[Sequence[Trajectory]], np.random.Generator]:
    """RoC's generator for each group of step `step`: seeded by (seed, step, prompt position)."""
    return lambda group: np.random.default_rng([seed, step, group[0].group_index])


def place(positions: Sequence[int], trajs: Sequence[Trajectory], per_prompt: int) -> None:
    """Give a node-shard's trajectories (grouped by prompt, `per_prompt` each, in the order of
    `positions`) their prompt position in the batch as `group_index`: RoC groups by it."""
    if len(trajs) != len(positions) * per_prompt:
        raise ValueError(f"a shard of {len(positions)} prompts holds {len(trajs)} trajectories, "
                         f"expected {len(positions) * per_prompt}")
    for j, pos in enumerate(positions):
        for t in trajs[j * per_prompt:(j + 1) * per_prompt]:
            t.group_index = pos


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


@dataclass
class HostSummary:
    """What a rollout host tells every rank about its part of the step (small: no tokens)."""
    node: int
    rolled_out: int                                  # trajectories this node rolled out
    groups: list[tuple[int, list[int]]]              # kept groups: (prompt position, member lengths)
    rollout: Tally                                   # `rollout_tally` of its trajectories
    roc: dict[str, float]                            # RocResult.metrics (counts, and its populations')
    roc_tally: Tally                                 # RocResult.tally
    seconds: dict[str, float]                        # time/rollout, time/reward
    report: Any = None                               # the rollout source's (the async staleness)


@dataclass
class StepShard:
    """This rank's part of the step, and the step's metrics over every host."""
    trajectories: list[Trajectory]                   # this rank's, in the global kept order
    advantages: list[float]
    mini_batches: list[int]                          # the global mini-batch of each
    kept: int                                        # trajectories kept, over all ranks
    tally: Tally                                     # the whole batch's rollout tally
    roc: dict[str, float]                            # the whole batch's RoC metrics
    seconds: dict[str, float]                        # rollout and reward (slowest host), tools (mean)
    per_node: dict[str, float] = field(default_factory=dict)
    reports: list[Any] = field(default_factory=list)
    records: list[dict[str, Any]] | None = None     # this host's rollout-log sample (`RolloutLog.pick`); None off-host
    log_seconds: float = 0.0                        # its cost on this host


class Plan:
    """Which rank trains which kept trajectory, the same on every rank (from the summaries alone).

    The global kept order is one host's: the kept groups by prompt position, each in its order."""

    def __init__(self, summaries: Sequence[HostSummary], world_size: int, mini_batches: int):
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


def merge_roc(summaries: Sequence[HostSummary]) -> dict[str, float]:
    """The hosts' RoC metrics as one host's: counts add up, the populations' come from the merged tally."""
    from rstar2_cli.rl.roc import POPULATIONS, population_metrics

    out: dict[str, float] = {}
    for s in summaries:
        for k, v in s.roc.items():
            out[k] = out.get(k, 0.0) + v
    tally = Tally.merged([s.roc_tally for s in summaries])
    for prefix in POPULATIONS:
        out.update(population_metrics(tally, prefix))
    return out


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


def select_on_host(piece: Piece, *, node: int, cfg: Any, step: int, keep: Filter | None, log: Any = None
                   ) -> tuple[list[Trajectory], list[float], HostSummary, tuple[list[dict[str, Any]], float]]:
    """Step 1 on a rollout host: place, filter (the source's hook), RoC, advantages, tallies, and
    the rollout log's records of step `step` + 1 with the seconds they took (`log`: a
    `rollout_log.RolloutLog`, or None)."""
    from rstar2_cli.rl import roc as roc_mod      # looked up at call time: tests record the selection
    from rstar2_cli.rl.loss import advantages_for_groups

    positions, trajs, seconds = piece
    place(positions, trajs, cfg.rollouts_per_prompt)
    for t in trajs:
        t.extra["node"] = node
    report = None
    kept_in = trajs
    if keep is not None:
        kept_in, report = keep(trajs)
    roc = roc_mod.select_for_training(kept_in, cfg.roc, cfg.train.group_size, group_rng(cfg.train.seed, step))
    advantages = advantages_for_groups(roc.groups)
    summary = HostSummary(node=node, rolled_out=len(trajs),
                          groups=[(g[0].group_index, [len(t.prompt_ids) + t.response_length for t in g])
                                  for g in roc.groups],
                          rollout=rollout_tally(kept_in, cfg.rollout.max_response_tokens), roc=dict(roc.metrics),
                          roc_tally=roc.tally, seconds=dict(seconds), report=report)
    started = time.perf_counter()
    records = log.pick(kept_in, roc.trajectories, advantages, step=step + 1, node=node) if log is not None else []
    return roc.trajectories, advantages, summary, (records, time.perf_counter() - started)


def share_step(piece: Piece | str | None, rollouts: Any, cfg: Any, step: int, keep: Filter | None = None,
               log: Any = None) -> StepShard:
    """Steps 1-3 of the module docstring on every rank. `piece`: this host's Piece, or a string
    saying why its rollout failed (every rank then raises), None off-host; `rollouts` gives
    `host` (is_host, node_index), `host_ranks` and `info` (rank, world_size); `log`: the
    `rollout_log.RolloutLog` that picks this host's records (StepShard.records)."""
    host, ranks, info = rollouts.host, rollouts.host_ranks, rollouts.info
    mine: Any = piece
    kept: list[Trajectory] = []
    advantages: list[float] = []
    records: tuple[list[dict[str, Any]], float] | None = None
    if host.is_host and not isinstance(piece, str):
        try:
            kept, advantages, mine, records = select_on_host(piece, node=host.node_index, cfg=cfg, step=step,
                                                             keep=keep, log=log)
        except Exception as e:
            if not rl_dist.is_distributed():
                raise
            log.exception("selection failed on this node")
            mine = f"node {host.node_index}: {e!r}"
    summaries = rl_dist.broadcast_from_each(mine, ranks)
    errors = [s for s in summaries if isinstance(s, str)]
    if errors:
        raise RuntimeError(f"rollout failed on {errors[0]}")
    plan = Plan(summaries, info.world_size, cfg.train.ppo_mini_batches)
    rows: list[tuple[int, int, Trajectory, float]] = []
    for h, src in enumerate(ranks):
        payloads = plan.payloads(h, kept, advantages) if info.rank == src else None
        rows += unpack(rl_dist.scatter_objects(payloads, src))
    rows.sort(key=lambda row: row[0])
    tally = Tally.merged([s.rollout for s in summaries])
    seconds = {k: max(s.seconds[f"time/{k}"] for s in summaries) for k in ("rollout", "reward")}
    seconds["tools"] = tally.mean("tool_time", "n")
    per_node = ({f"rollout/trajectories_node{s.node}": float(s.rolled_out) for s in summaries}
                if len(summaries) > 1 else {})
    return StepShard(trajectories=[r[2] for r in rows], advantages=[r[3] for r in rows],
                     mini_batches=[r[1] for r in rows], kept=len(plan.lengths), tally=tally, roc=merge_roc(summaries),
                     seconds=seconds, per_node=per_node, reports=[s.report for s in summaries],
                     records=None if records is None else records[0], log_seconds=records[1] if records else 0.0)
