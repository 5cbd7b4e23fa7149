"""Where an RL run starts: fresh, from its own latest checkpoint, or continuing the previous stage.

`--resume` (`resume_mode`): "latest" needs a checkpoint under `train.out_dir`; "auto" takes it if
there is one, else starts fresh. Which one, and why, is said in one line (`resume_point`); a damaged
or missing one is an error, never a silent fall back to an older one. A resumed run takes the
checkpoint's weights (the engines load the checkpoint folder, a plain HF model folder), optimizer,
LR schedule, data position and the trainer's extras (fault counters, the tool-loop alarm's
baseline, ...).

A fresh run of a stage with `init_from` continues the previous stage's AdamW state and LR-schedule
position unless `optim.reset` (rl/run/stages.py); a `model.path` that is not an rstar2 checkpoint has
none to continue (an SFT or HF model): AdamW starts fresh.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rstar2_cli.config import RecipeConfig
from rstar2_cli.rl.update import checkpoint
from rstar2_cli.rl.update import checkpoint_check
from rstar2_cli.rl.run.preemption import RESUME_MODES
from rstar2_cli.rl.run.stages import continues_optimizer

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


class ResumeError(ValueError):
    """The run cannot resume as asked (one line naming the folder or file and the way on)."""


def resume_point(out_dir: str | Path, mode: str | None) -> tuple[Path | None, str]:
    """The checkpoint `--resume <mode>` takes in `out_dir` and why (None, "": a fresh start).

    `latest` names it; without that file, the newest complete step_* folder. A `latest` that names
    no complete checkpoint, or a checkpoint with a file cut short (`checkpoint_check.damage`), is a
    ResumeError: the run never falls back to an older checkpoint by itself; the message says what
    to remove to resume from the one before."""
    if mode is None:
        return None, ""
    out_dir = Path(out_dir)
    latest, steps = out_dir / "latest", checkpoint.complete_step_folders(out_dir)
    if latest.is_file():
        named = out_dir / latest.read_text().strip()
        if not checkpoint.is_checkpoint(named):
            what = "is gone" if not named.exists() else "is not a complete checkpoint (no state/.metadata)"
            older = [p for p in steps if p != named]
            way = (f"remove {latest} to resume from {older[-1]}, the newest complete step folder" if older
                   else f"remove {latest} and run without --resume to start fresh")
            raise ResumeError(f"--resume: {latest} names {named.name}, which {what}; {way}")
        ckpt, why = named, f"the checkpoint {latest} names"
    elif steps:
        ckpt, why = steps[-1], f"no {latest} file: the newest complete step folder"
    elif mode == "latest":
        raise ResumeError(f"--resume: no checkpoint in {out_dir}; --resume auto starts fresh when there is none")
    else:
        return None, f"--resume auto: no checkpoint in {out_dir}, starting fresh"
    found = checkpoint_check.damage(ckpt)
    if found:
        older = [p for p in steps if p.name < ckpt.name and not checkpoint_check.damage(p)]
        way = (f"remove {ckpt}{' and ' + str(latest) if latest.is_file() else ''} to resume from {older[-1]}"
               if older else "no complete checkpoint before it: run without --resume (into another "
                             "train.out_dir) to start fresh")
        raise ResumeError(f"--resume: checkpoint {ckpt} is damaged ({found}); the run does not fall back by "
                          f"itself: {way}")
    return ckpt, why


def start_run(cfg: RecipeConfig, resume: bool | str | None, policy: Any, sampler: Any, *, is_main: bool) -> Start:
    """Load what `resume` asks for into `policy` and `sampler` (module docstring); the main rank says
    which checkpoint it took and why."""
    ckpt, why = resume_point(cfg.train.out_dir, resume_mode(resume))
    if ckpt is not None:
        state = checkpoint.load_checkpoint(ckpt, policy, sampler, reset_optimizer=False)
        if is_main:
            print(f"resuming at step {state.step} from {ckpt} ({why})", file=sys.stderr, flush=True)
        return Start(state.step, str(ckpt), ckpt, dict(state.extra))
    if why and is_main:
        print(why, file=sys.stderr, flush=True)
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
