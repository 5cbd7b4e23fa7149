"""What a rollout host tells every rank about its part of a step, and the step's columns from them.

Each rollout host rolls out, grades and selects over its own node-shard of the step's prompts; its
`HostSummary` holds no tokens, only the kept groups' shape (for the exchange's plan) and the additive
form of its metrics (`metrics.Tally`). Merged over the hosts (`step_columns`) they give exactly the
values one host holding the whole batch would log: N nodes log what one node logs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rstar2_cli.rl.measures.tally import Tally, rollout_tally, step_metrics

from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rl.selection.roc import POPULATIONS, RocResult, population_metrics
from rstar2_cli.rollout.trajectory import Trajectory


@dataclass
class HostSummary:
    """A rollout host's part of the step (small: sent to every rank)."""
    node: int
    rolled_out: int                                  # trajectories this node rolled out
    groups: list[tuple[int, list[int]]]              # kept groups: (prompt position, member token lengths)
    rollout: Tally                                   # `rollout_tally` of what RoC saw
    roc: dict[str, float]                            # RocResult.metrics (counts, and its populations')
    roc_tally: Tally                                 # RocResult.tally
    seconds: dict[str, float]                        # {"time/rollout": s, "time/reward": s} on this host


def host_summary(node: int, rolled_out: int, seen: Sequence[Trajectory], roc: RocResult, seconds: Mapping[str, float],
              max_response_tokens: int) -> HostSummary:
    """The summary of a host that rolled out `rolled_out` trajectories, of which RoC saw `seen` and chose `roc`."""
    return HostSummary(node=node, rolled_out=rolled_out,
                       groups=[(g[0].group_index, [len(t.prompt_ids) + t.response_length for t in g])
                               for g in roc.groups],
                       rollout=rollout_tally(seen, max_response_tokens), roc=dict(roc.metrics), roc_tally=roc.tally,
                       seconds={k: float(seconds.get(k, 0.0)) for k in ("time/rollout", "time/reward")})


def merge_roc(summaries: Sequence[HostSummary]) -> dict[str, float]:
    """The hosts' RoC metrics as one host's: counts add up, the populations' come from the merged tally."""
    out: dict[str, float] = {}
    for s in summaries:
        for k, v in s.roc.items():
            out[k] = out.get(k, 0.0) + v
    tally = Tally.merged([s.roc_tally for s in summaries])
    for prefix in POPULATIONS:
        out.update(population_metrics(tally, prefix))
    return out


def step_columns(step: int, summaries: Sequence[HostSummary], update: Mapping[str, float],
                 timer: StepTimer) -> dict[str, float]:
    """The step's row: its rollouts, RoC and update over every host; time/rollout and time/reward
    are the slowest host's (every rank waits for it), time/tools the mean per trajectory."""
    tally = Tally.merged([s.rollout for s in summaries])
    for name in ("rollout", "reward"):
        timer.seconds[name] = max(s.seconds[f"time/{name}"] for s in summaries)
    timer.seconds["tools"] = tally.mean("tool_time", "n")
    out = step_metrics(step, tally, merge_roc(summaries), update, timer)
    if len(summaries) > 1:
        out.update({f"rollout/trajectories_node{s.node}": float(s.rolled_out) for s in summaries})
    return out
