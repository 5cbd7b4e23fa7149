"""Which rolled-out trajectories the update learns from: one decision per trajectory.

Why one place: a trajectory is training signal only if its outcome is the model's own. Three
kinds of fault are not (they say nothing about the policy, and as zero-reward members they would
push its probability down as if the answer were wrong):
  * sandbox: a call lost to the infrastructure (`Trajectory.infra_error` "sandbox_internal_error":
    a worker crash, a queue timeout, a remote backend error; `rollout/agent_loop.py`);
  * engine: the engine failed the request (`infra_error` "engine_error": `EngineRequestError`, or
    vLLM's own server-side errors, `rollout/generation.py`); a bug in the loop itself raises instead;
  * grader: the grader timed out, crashed or raised (`reward/result.py` reasons "timeout",
    "grader_crash", "grader_error"): the reward 0 it carries is no verdict on the answer.
Each is excluded before RoC and advantages and counted per reason (`faults/excluded_<reason>`,
with `roc/infra_excluded` the total). One more exclusion is a policy choice, off by default:
`roc.exclude_void_turns` leaves out trajectories with a void turn (`agent/void_turn_excluded`;
SimpleTIR, arXiv 2509.02479, filters them to keep multi-turn training stable).
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from rstar2_cli.rollout.trajectory import Trajectory

# grade reasons that are the grader's failure, not a verdict (reward/result.py), and the fault each is
GRADER_FAULTS = {"timeout": "grader_timeout", "grader_crash": "grader_crash", "grader_error": "grader_error"}
VOID_TURN = "void_turn"


def exclusion_reason(t: Trajectory, *, exclude_void_turns: bool = False) -> str | None:
    """None: `t` trains. Otherwise why it is left out: its infrastructure fault
    ("sandbox_internal_error", "engine_error"), a grader fault (`GRADER_FAULTS`), or "void_turn"
    (only with `exclude_void_turns`)."""
    if t.infra_error:
        return t.infra_error
    if t.grade_reason in GRADER_FAULTS:
        return GRADER_FAULTS[t.grade_reason]
    if exclude_void_turns and t.num_void_turns > 0:
        return VOID_TURN
    return None


def split_for_training(trajectories: Iterable[Trajectory], *,
                       exclude_void_turns: bool = False) -> tuple[list[Trajectory], dict[str, float]]:
    """(the trajectories that train, metrics counting the others per reason); each one left out
    carries its reason in `Trajectory.exclusion` (the rollout log's `fault`)."""
    kept: list[Trajectory] = []
    faults: Counter = Counter()
    void = 0
    for t in trajectories:
        reason = exclusion_reason(t, exclude_void_turns=exclude_void_turns)
        if reason is None:
            kept.append(t)
            continue
        t.exclusion = reason
        if reason == VOID_TURN:
            void += 1
        else:
            faults[reason] += 1
    metrics = {"roc/infra_excluded": float(sum(faults.values())), "faults/excluded": float(sum(faults.values())),
               "agent/void_turn_excluded": float(void)}
    for kind, n in faults.items():
        metrics[f"roc/infra_excluded_{kind}"] = float(n)
        metrics[f"faults/excluded_{kind}"] = float(n)
    return kept, metrics
