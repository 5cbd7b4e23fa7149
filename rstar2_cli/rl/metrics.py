"""One RL step's metrics: gathered into a flat dict, appended to metrics.jsonl, optionally mirrored.

Why a flat dict with slash-separated names ("rollout/accuracy", "train/grad_norm"): the same
record goes to JSONL (the source of truth, one line per step, readable by pandas/jq), to
TensorBoard when `tensorboard` is installed and to wandb when enabled, without translation.
Held-out points (`eval/...`, see `validation.py`) ride on their step's record (step 0: a record
of their own), and `plot_curves` draws curves.png from the JSONL: training reward with held-out
accuracy, response lengths (training and held-out), tool-error ratios and per-step filtering.
"""
from __future__ import annotations

import json
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from rstar2_cli.rollout.trajectory import Trajectory


class StepTimer:
    """The wall clock of one step: `with timer("train"): ...` -> time/train; `timer.add("rollout",
    s)` records a section timed elsewhere (on a rollout host, or on the rollout thread); time/step
    is the wall time from the timer's creation to `stop()` (to `metrics()` if never stopped)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.total: float | None = None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def elapsed(self) -> float:
        """Seconds since the timer was created."""
        return time.perf_counter() - self.started

    def stop(self) -> None:
        """Fix time/step at the wall time so far."""
        self.total = self.elapsed()

    def sections(self) -> dict[str, float]:
        """{"time/<name>": seconds} of the sections, without time/step."""
        return {f"time/{k}": v for k, v in self.seconds.items()}

    def metrics(self) -> dict[str, float]:
        return {**self.sections(), "time/step": self.elapsed() if self.total is None else self.total}


@dataclass
class Tally:
    """The additive form of metrics over a set of trajectories: sums, maxima and minima. Why:
    each rollout host selects and tallies its own trajectories (`rl/step_summary.py`), and the hosts'
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
        # the tool-loop alarm's (rl/tool_loop.py): calls per trajectory are rollout/tool_calls_{mean,max}
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


LIVE_COLUMNS = [("step", "step", "{:.0f}"), ("rollout/accuracy", "acc", "{:.3f}"),
                ("roc/groups_kept", "groups", "{:.0f}"), ("rollout/response_length_mean", "len", "{:.0f}"),
                ("rollout/tool_error_ratio", "tool err", "{:.3f}"), ("train/loss", "loss", "{:+.4f}"),
                ("train/grad_norm", "grad", "{:.3f}"), ("train/entropy", "entropy", "{:.3f}"),
                ("train/clip_frac", "clip", "{:.4f}"), ("eval/accuracy", "held-out", "{:.3f}"),
                ("time/step", "s/step", "{:.1f}")]


class MetricsWriter:
    """Appends a JSON line per step to <out_dir>/metrics.jsonl; a live rich table row and
    TensorBoard/wandb mirrors if asked. `enabled=False` (non-zero ranks) makes it a no-op."""

    def __init__(self, out_dir: str | Path, tensorboard: bool = False, wandb: bool = False, *,
                 enabled: bool = True, live: bool = False):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled, self.live = enabled, live
        self._tb = self._wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is optional (train.tensorboard)
            except ImportError as e:
                raise RuntimeError("train.tensorboard is on but tensorboard is not installed: "
                                   "pip install tensorboard") from e
            self._tb = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_mod
            except ImportError as e:
                raise RuntimeError("train.wandb is on but wandb is not installed: pip install wandb") from e
            self._wandb = wandb_mod.init(dir=str(out_dir))

    def note(self, line: str) -> None:
        """One line in the log and, live, under the table (the tool-loop alarm's)."""
        if not self.enabled:
            return
        logging.getLogger(__name__).warning(line)
        if self.live:
            from rich.console import Console

            Console().print(line, style="bold red", markup=False, highlight=False)

    def keep_through(self, step: int | None) -> None:
        """Drop the rows after `step` (all of them if None): a resumed run writes the steps after
        its checkpoint again, so the rows a stopped run wrote past it would be doubled."""
        if not self.enabled or not self.path.is_file():
            return
        rows = self.path.read_text().splitlines(keepends=True)
        kept = [r for r in rows if step is not None and r.strip() and json.loads(r).get("step", 0) <= step]
        if len(kept) != len(rows):
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(kept))
            tmp.replace(self.path)

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **{k: v for k, v in clean.items() if k != "step"}}) + "\n")
        numeric = {k: float(v) for k, v in clean.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self.live:
            self._print_row(step, clean)

    def _print_row(self, step: int, metrics: Mapping[str, Any]) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_header=(step <= 1 or not getattr(self, "_header_shown", False)), box=None)
        for _, title, _ in LIVE_COLUMNS:
            table.add_column(title, justify="right", min_width=8)
        values = {**metrics, "step": step}
        table.add_row(*[fmt.format(values[k]) if isinstance(values.get(k), (int, float)) else "-"
                        for k, _, fmt in LIVE_COLUMNS])
        Console().print(table)
        self._header_shown = True

    def plot(self) -> Path | None:
        """curves.png next to metrics.jsonl (main rank; nothing when no step was logged)."""
        if not self.enabled or not self.path.is_file():
            return None
        rows = read_metrics(self.path)
        if not rows:
            return None
        target = self.path.with_name("curves.png")
        plot_curves(rows, target)
        return target

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curves(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Four panels from metrics.jsonl rows: reward and held-out accuracy, response lengths,
    tool-error ratios, and groups kept / steps skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eval_sets = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("eval/") and k.count("/") == 2})
    panels = [
        (
            "reward and held-out accuracy",
            [("rollout/reward_mean", "training reward")] + [(f"eval/{n}/accuracy", f"{n} avg@k") for n in eval_sets],
        ),
        (
            "response length (tokens)",
            [("rollout/response_length_mean", "training")] + [(f"eval/{n}/response_tokens_mean", n) for n in eval_sets],
        ),
        (
            "tool-error ratio",
            [
                ("rollout/tool_error_ratio", "all"),
                ("rollout/tool_error_ratio_positive", "positive"),
                ("roc_after/tool_error_ratio_positive", "positive, kept by RoC"),
            ],
        ),
        (
            "groups",
            [
                ("roc/groups_kept", "kept"),
                ("roc/groups_dropped", "dropped"),
                ("roc/infra_excluded", "faulted trajectories (sandbox, engine, grader)"),
                ("train/skipped_empty", "step skipped"),
            ],
        ),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (title, lines) in zip(axes.flat, panels):
        for key, label in lines:
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, marker="o" if key.startswith("eval/") else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
