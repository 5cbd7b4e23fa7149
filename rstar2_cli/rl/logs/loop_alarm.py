"""The tool-loop alarm: a policy that starts calling its tool over and over.

Why: a run whose tool calls per trajectory climb step after step (the same snippet run again and
again, turns ending at the turn cap) is learning a loop, and its reward curve can look fine while
it does. The signal is in the step metrics, computed from the hosts' merged tally
(`rl/logs/writer.py`): `rollout/tool_calls_mean` (calls per trajectory; `_max` and
`tools/calls_per_traj_p95` beside it), `tools/repeated_code_ratio` (calls whose code an earlier
call of the same trajectory ran, `rollout/agent_loop.py`) and `rollout/max_turns_ratio`
(trajectories stopped at the turn cap).

The rule: the baseline Y is the mean of `rollout/tool_calls_mean` over the run's first
`train.tool_loop_baseline_steps` steps; after them, a step whose calls per trajectory X exceed
`train.tool_loop_factor` x Y (Y > 0: a baseline without calls gives no ratio) raises the alarm
once per crossing: one line in the log and under the live table, and `tools/loop_alarm` 1 in
metrics.jsonl for every step above the line. It re-arms when X falls back to the line or under.
With `train.stop_on_tool_loop` the trainer checkpoints and stops at the alarm (`RunAborted`, as
for non-finite steps). Every rank computes the same metrics from the same tally, so every rank
decides alike; the baseline rides in the checkpoint, so a resumed run keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

CALLS = "rollout/tool_calls_mean"
REPEATED = "tools/repeated_code_ratio"


@dataclass
class ToolLoopAlarm:
    baseline_steps: int
    factor: float
    baseline: list[float] = field(default_factory=list)   # calls per trajectory of the first steps
    above: bool = False                                    # the last step was over the line

    @property
    def reference(self) -> float | None:
        """Y, once the baseline steps are in."""
        if len(self.baseline) < self.baseline_steps:
            return None
        return sum(self.baseline) / len(self.baseline)

    def observe(self, step: int, metrics: Mapping[str, Any]) -> str | None:
        """Take step `step`'s metrics; the alarm's line when this step crosses, else None."""
        calls = metrics.get(CALLS)
        if not isinstance(calls, (int, float)):
            return None
        ref = self.reference
        if ref is None:
            self.baseline.append(float(calls))
            return None
        was_above, self.above = self.above, ref > 0 and calls > self.factor * ref
        if not self.above or was_above:
            return None
        return (f"tool-loop alarm: step {step}: {calls:.2f} calls per trajectory, {calls / ref:.1f} x the first "
                f"steps' {ref:.2f}; repeated code {100 * float(metrics.get(REPEATED, 0.0)):.1f} %")

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": list(self.baseline), "above": self.above}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.baseline, self.above = [float(x) for x in state.get("baseline", [])], bool(state.get("above", False))
