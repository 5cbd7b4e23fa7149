"""One RL step's metrics: gathered into a flat dict, appended to metrics.jsonl, optionally mirrored.

Why a flat dict with slash-separated names ("rollout/accuracy", "train/grad_norm"): the same
record goes to JSONL (the source of truth, one line per step, readable by pandas/jq), to
TensorBoard when `tensorboard` is installed and to wandb when enabled, without translation.
Held-out points (`eval/...`, see `validation.py`) ride on their step's record (step 0: a record
of their own), and `plots.plot_curves` draws curves.png from the JSONL: training reward with held-out
accuracy, response lengths (training and held-out), tool-error ratios and per-step filtering.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping

from rstar2_cli.rl.logs.plots import plot_curves


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
