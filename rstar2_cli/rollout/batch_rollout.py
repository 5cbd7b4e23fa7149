"""A step's roll-out on one rollout host, and its grading: plain functions.

`roll_out` rolls out this node's shard of a step's prompts through the agent loop (the fleet's
replicas behind its scheduler, the sandbox for tool calls): `rollouts_per_prompt` trajectories per
prompt, each carrying its prompt's position in the step's batch as `group_index` (RoC groups by
it) and the node in `rollout_node`. Sampling seeds depend on the step, the prompt id and the
sample index only (`agent_loop`), so which node rolls a prompt out changes nothing; a prompt drawn
twice in one batch gets fresh seeds for its later draw (`occurrences` over the whole batch).

`grade` gives every trajectory its binary outcome reward (paper §2.1: the final boxed answer,
verified; `reward.grade_batch`, whose worker processes time out a pathological answer).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rstar2_cli.config import RecipeConfig, RewardConfig
from rstar2_cli.reward import grade_batch
from rstar2_cli.rollout.agent_loop import occurrences, run_agent_loop
from rstar2_cli.rollout.trajectory import Trajectory


async def roll_out(batch: Sequence[Any], positions: Sequence[int], fleet: Any, tools: Any, tokenizer: Any,
                   cfg: RecipeConfig, *, index: int, node: int = 0, priority: int = 0,
                   progress: bool = False) -> list[Trajectory]:
    """This node's trajectories of batch `index` (the problems `batch`, of which this node takes
    `positions`), grouped by prompt in the order of `positions`. `priority`: the engines' request
    priority of every turn (lower first)."""
    if not positions:
        return []
    drawn = occurrences([p.id for p in batch])
    mine = [batch[i] for i in positions]
    trajs = await run_agent_loop([(p.id, p.problem, p.answer) for p in mine], cfg.rollouts_per_prompt,
                                 fleet.scheduler, tools, tokenizer, cfg.rollout,
                                 seed=cfg.train.seed * 1_000_003 + index, progress=progress,
                                 group_indices=list(positions), occurrence=[drawn[i] for i in positions],
                                 priority=priority, recover=fleet.supervisor.recover)
    for t in trajs:
        t.rollout_node = node
    return trajs


def grade(trajs: Sequence[Trajectory], reward: RewardConfig) -> None:
    """Set each trajectory's `reward`, `extracted` answer and `grade_reason`."""
    grades = grade_batch([(t.text, t.gold) for t in trajs], timeout=reward.timeout, mode=reward.mode,
                         workers=reward.workers)
    for t, g in zip(trajs, grades):
        t.reward, t.extracted, t.grade_reason = g.reward, g.extracted, g.reason
