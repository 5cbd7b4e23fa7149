"""A step's metric columns from its trajectories, in additive form: a rollout host tallies its own
(`rollout_tally`), the tallies of every host add up (`Tally.merged`), and `finish_rollout` /
`step_metrics` turn them into the logged values, so N nodes log what one node logs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rollout.trajectory import Trajectory


@dataclass
class Tally:
    """The additive form of metrics over a set of trajectories: sums, maxima and minima. Why:
    each rollout host selects and tallies its own trajectories (`rl/selection/step_summary.py`), and the hosts'
    tallies merge into exactly the tally of the whole batch, so the logged means and ratios are
    those of one host holding every trajectory."""
    sums: dict[str, float] = field(default_factory=dict)
    maxs: dict[str, float] = field(default_factory=dict)
    mins: dict[str, float] = field(default_factory=dict)

    def __iadd__(self, other: "Tally") -> "Tally":
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        for mine, theirs, pick in ((self.maxs, other.maxs, max), (self.mins, other.mins, min)):
            for k, v in theirs.items():
                mine[k] = pick(mine[k], v) if k in mine else v
        return self

    @classmethod
    def merged(cls, parts: Sequence["Tally"]) -> "Tally":
        out = cls()
        for p in parts:
            out += p
        return out

    def spread(self, name: str, values: Sequence[float]) -> None:
        """Sum, max and min of `values` under `name` (nothing for an empty list)."""
        if values:
            self.sums[name] = self.sums.get(name, 0.0) + float(sum(values))
            self.maxs[name] = max(self.maxs.get(name, -math.inf), float(max(values)))
            self.mins[name] = min(self.mins.get(name, math.inf), float(min(values)))

    def mean(self, name: str, count: str) -> float:
        n = self.sums.get(count, 0.0)
        return self.sums.get(name, 0.0) / n if n else 0.0


def tool_error_ratio(ts: Sequence[Trajectory]) -> float:
    """Failed tool calls / tool calls over `ts` (0.0 when there were no calls)."""
    calls = sum(t.num_tool_calls for t in ts)
    return sum(t.num_tool_errors for t in ts) / calls if calls else 0.0


SPREAD = ("response_length", "turns", "tool_calls")    # logged as _mean, _max, _min


CALLS_HIST = "calls_hist:"                             # tally key prefix: trajectories with that many calls


def calls_p95(tally: Tally) -> float:
    """The nearest-rank 95th percentile of tool calls per trajectory, from the tally's histogram."""
    hist = sorted((int(k[len(CALLS_HIST):]), v) for k, v in tally.sums.items() if k.startswith(CALLS_HIST))
    need, seen = 0.95 * sum(v for _, v in hist), 0.0
    for calls, v in hist:
        seen += v
        if seen >= need:
            return float(calls)
    return 0.0


def rollout_tally(trajectories: Sequence[Trajectory], max_response_tokens: int | None = None) -> Tally:
    """Reward/accuracy, lengths, turns and tool use (`rollout/tool_calls_mean`: calls per
    trajectory; void turns; the share stopped at the turn cap) over ALL rollouts of the step, in an
    additive form that merges over hosts (`finish_rollout` turns it into the logged values)."""
    ts, limit, out = list(trajectories), max_response_tokens, Tally()
    pos = [t for t in ts if t.reward > 0]
    out.sums.update({
        "n": float(len(ts)), "reward": float(sum(t.reward for t in ts)), "positives": float(len(pos)),
        "clipped": float(sum(t.finish_reason == "length" or (limit is not None and t.response_length >= limit)
                             for t in ts)),
        "tool_errors": float(sum(t.num_tool_errors for t in ts)),
        "tool_calls_positive": float(sum(t.num_tool_calls for t in pos)),
        "tool_errors_positive": float(sum(t.num_tool_errors for t in pos)),
        "tool_time": float(sum(t.tool_time for t in ts)), "infra_errors": float(sum(bool(t.infra_error) for t in ts)),
        "tokens": float(sum(len(t.prompt_ids) + t.response_length for t in ts)),
        "void_turns": float(sum(t.num_void_turns for t in ts)),
        "void_trajectories": float(sum(t.num_void_turns > 0 for t in ts)),
        "max_turns": float(sum(t.finish_reason == "max_turns" for t in ts)),
        "repeated_code_calls": float(sum(t.num_repeated_code_calls for t in ts)),
    })
    for t in ts:     # calls per trajectory as a histogram: hosts' tallies merge into the batch's exact p95
        key = f"{CALLS_HIST}{t.num_tool_calls}"
        out.sums[key] = out.sums.get(key, 0.0) + 1.0
    for name, values in zip(SPREAD, ([t.response_length for t in ts], [t.num_turns for t in ts],
                                     [t.num_tool_calls for t in ts])):
        out.spread(name, values)
    out.sums.setdefault("tool_calls", 0.0)
    return out


def finish_rollout(tally: Tally) -> dict[str, float]:
    """Reward/accuracy, lengths, turns and tool use over ALL rollouts of the step, from their tally."""
    s = tally.sums
    if not s.get("n"):
        return {"rollout/trajectories": 0.0}
    out = {
        "rollout/trajectories": s["n"],
        "rollout/reward_mean": s["reward"] / s["n"],
        "rollout/accuracy": s["positives"] / s["n"],
        "rollout/clip_ratio": s["clipped"] / s["n"],
        "rollout/tool_calls_total": s["tool_calls"],
        "rollout/tool_error_ratio": s["tool_errors"] / s["tool_calls"] if s["tool_calls"] else 0.0,
        "rollout/tool_error_ratio_positive": (s["tool_errors_positive"] / s["tool_calls_positive"]
                                              if s["tool_calls_positive"] else 0.0),
        "rollout/tool_time_total": s["tool_time"],
        "rollout/infra_errors": s["infra_errors"],   # left their groups (RoC)
        # void turns (agent_loop.py; SimpleTIR, arXiv 2509.02479): per turn and per trajectory
        "rollout/void_turn_ratio": s["void_turns"] / s["turns"] if s.get("turns") else 0.0,
        "rollout/void_turn_trajectories": s["void_trajectories"] / s["n"],
        # stopped by rollout.max_turns with a call still to run
        "rollout/max_turns_ratio": s["max_turns"] / s["n"],
        # the tool-loop alarm's (rl/logs/loop_alarm.py): calls per trajectory are rollout/tool_calls_{mean,max}
        # below, trajectories at the turn cap rollout/max_turns_ratio above
        "tools/calls_per_traj_p95": calls_p95(tally),
        "tools/repeated_code_ratio": s.get("repeated_code_calls", 0.0) / s["tool_calls"] if s["tool_calls"] else 0.0,
    }
    for name in SPREAD:
        out.update({f"rollout/{name}_mean": s[name] / s["n"], f"rollout/{name}_max": tally.maxs[name],
                    f"rollout/{name}_min": tally.mins[name]})
    return out


def step_metrics(step: int, rollouts: Sequence[Trajectory] | Tally, roc: Any = None,
                 update: Mapping[str, float] | None = None, timing: StepTimer | Mapping[str, float] | None = None,
                 max_response_tokens: int | None = None) -> dict[str, float]:
    """Everything logged for one step.

    rollouts: the step's trajectories or their (merged) `rollout_tally`; roc: a RocResult or a
    metrics dict; update: PolicyTrainer.update()'s dict; timing: a StepTimer or a
    {"time/<phase>": seconds} dict (rollout, tools, reward, train, sync, step).
    """
    tally = rollouts if isinstance(rollouts, Tally) else rollout_tally(rollouts, max_response_tokens)
    out: dict[str, float] = {"step": float(step)}
    out.update(finish_rollout(tally))
    out.update(dict(getattr(roc, "metrics", roc) or {}))
    out.update({f"train/{k}": float(v) for k, v in (update or {}).items()})
    times = timing.metrics() if isinstance(timing, StepTimer) else dict(timing or {})
    out.update(times)
    if times.get("time/rollout"):
        out["throughput/rollout_tokens_per_s"] = tally.sums.get("tokens", 0.0) / times["time/rollout"]
    if update and times.get("time/train"):
        out["throughput/train_loss_tokens_per_s"] = float(update.get("loss_tokens", 0.0)) / times["time/train"]
    return out
