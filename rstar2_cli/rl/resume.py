"""Where an RL run starts: fresh, from its own latest checkpoint, or continuing the previous stage.

`--resume` (`resume_mode`): "latest" needs a checkpoint under `train.out_dir`; "auto" takes it if
there is one, else starts fresh. A resumed run takes the checkpoint's weights (the engines load
the checkpoint folder, a plain HF model folder), optimizer, LR schedule, data position and the
trainer's extras (fault counters, the tool-loop alarm's baseline, ...).

A fresh run of a stage with `init_from` continues the previous stage's AdamW state and LR-schedule
position unless `optim.reset` (rl/stages.py); a `model.path` that is not an rstar2 checkpoint has
none to continue (an SFT or HF model): AdamW starts fresh.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_cli.config import RecipeConfig
from rstar2_cli.rl import checkpoint
from rstar2_cli.rl.preemption import RESUME_MODES
from rstar2_cli.rl.stages import continues_optimizer

log = logging.getLogger(__name__)


def resume_mode(resume: bool | str | None) -> str | None:
    """`--resume` as given: True or "latest" (the latest checkpoint, which must exist), "auto"
    (the latest if there is one, else a fresh start), False/None (a fresh start)."""
    if resume is True or resume == "latest":
        return "latest"
    if resume is False or resume is None:
        return None
    if resume == "auto":
        return "auto"
    raise ValueError(f"--resume {resume!r}: expected one of {', '.join(RESUME_MODES)}")


@dataclass
class Start:
    """Where the run starts: the step, the weights the engines load, the checkpoint on disk (None:
    the start model) and the checkpoint's trainer extras ({} when fresh)."""
    step: int
    engine_weights: str
    checkpoint: Path | None
    extra: dict[str, Any] = field(default_factory=dict)


def start_run(cfg: RecipeConfig, resume: bool | str | None, policy: Any, sampler: Any, *, is_main: bool) -> Start:
    """Load what `resume` asks for into `policy` and `sampler` (module docstring)."""
    out_dir = Path(cfg.train.out_dir)
    mode = resume_mode(resume)
    ckpt = checkpoint.latest_checkpoint(out_dir) if mode else None
    if mode == "latest" and ckpt is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {out_dir}")
    if ckpt is not None:
        state = checkpoint.load_checkpoint(ckpt, policy, sampler, reset_optimizer=False)
        return Start(state.step, str(ckpt), ckpt, dict(state.extra))
    if mode == "auto":
        log.info("--resume auto: no checkpoint under %s, starting fresh", out_dir)
    continue_stage(cfg, policy, is_main=is_main)
    return Start(0, cfg.model.path, None)


def continue_stage(cfg: RecipeConfig, policy: Any, *, is_main: bool) -> None:
    """The previous stage's AdamW state and LR position into `policy`, if this stage continues them."""
    if not continues_optimizer(cfg):
        return
    if not checkpoint.is_checkpoint(Path(cfg.model.path)):
        log.warning("init_from %s: %s is no RL checkpoint (no optimizer state); AdamW starts fresh",
                    cfg.init_from, cfg.model.path)
        return
    position = checkpoint.continue_optimizer(cfg.model.path, policy)
    if is_main:
        log.info("init_from %s: AdamW state and LR schedule continue from %s (%d LR steps taken)",
                 cfg.init_from, cfg.model.path, position)
