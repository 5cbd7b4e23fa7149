"""A rollout host's half of the step: from its graded rollouts to what it sends the exchange.

Each rollout host holds the graded trajectories of its node-shard of the step's prompts (a
`GradedBatch`, from the run's batch source: `batch_source.py`). `select_on_host` runs, in the
paper's order: the exclusions and RoC down to G per group (`roc.select_for_training`, which
excludes first: `exclusion.py`), the group-normalised advantages over the kept G
(`loss.advantages_for_groups`), the host's summary every rank receives (`step_summary.py`), and
the host's rollout-log sample (`rollout_log.StepLog.pick`: only the picked groups outlive the
exchange). The step, the exchange test and `benchmarks/timing/bench_exchange.py` all call it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar2_cli.config import RecipeConfig
from rstar2_cli.rl.ranks.exchange import HostSelection
from rstar2_cli.rl.update.loss import advantages_for_groups
from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rl.selection.roc import group_rng, select_for_training
from rstar2_cli.rl.selection.step_summary import host_summary
from rstar2_cli.rollout.trajectory import Trajectory

# (the trajectories RoC saw, the kept ones in RoC's order, their advantages) -> None
Pick = Callable[[Sequence[Trajectory], Sequence[Trajectory], Sequence[float]], None]


@dataclass
class GradedBatch:
    """A rollout host's part of a step's batch, rolled out and graded: the trajectories RoC may see
    (an ahead-of-time source has dropped the stale groups), how many were rolled out, and the
    host's {"time/rollout": s, "time/reward": s}. `report`: what an ahead-of-time source tells
    every rank about staleness (`async_rollouts.HostReport`); None for the synchronous source."""
    trajectories: list[Trajectory]
    rolled_out: int
    seconds: dict[str, float] = field(default_factory=dict)
    report: Any = None


def select_on_host(graded: GradedBatch, cfg: RecipeConfig, *, index: int, node: int,
                   pick: Pick | None = None, timer: StepTimer | None = None) -> HostSelection:
    """Steps 4-5 on rollout host `node` for batch `index` (the weights' version that rolled it out:
    RoC's generator is keyed by it, `roc.group_rng`), then its summary and rollout-log `pick`
    (timed as "rollout_log" when a `timer` is given)."""
    seen = graded.trajectories
    roc = select_for_training(seen, cfg.roc, cfg.train.group_size, group_rng(cfg.train.seed, index))
    advantages = advantages_for_groups(roc.groups)
    summary = host_summary(node, graded.rolled_out, seen, roc, graded.seconds, cfg.rollout.max_response_tokens)
    if pick is not None:
        with (timer or StepTimer())("rollout_log"):
            pick(seen, roc.trajectories, advantages)
    return HostSelection(roc.trajectories, advantages, summary)
