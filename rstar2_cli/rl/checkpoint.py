"""RL checkpoints: a servable HF folder plus everything `--resume` needs to continue exactly.

A checkpoint folder (e.g. `<out_dir>/step_000010` or `<out_dir>/final`) IS a plain HF model
folder, so `vllm serve`, `from_pretrained` and the next stage's `model.path` load it directly:
  config.json, model.safetensors, generation_config.json, tokenizer files
  optimizer.pt        AdamW state keyed by parameter name (full, gathered through
                      torch.distributed.checkpoint.state_dict, FSDP2-aware): any world size resumes it
  trainer_state.pt    step, LR scheduler, DataSampler position, the RoC numpy Generator,
                      python/numpy/torch RNG states and a caller `extra` dict
`<out_dir>/latest` names the newest complete folder. A folder is written under a temporary name
and renamed when complete, so a crash never leaves a half-written checkpoint behind `latest`.
All ranks must call save/load (the state gathers are collectives); only rank 0 writes.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.model_load import fill_from_safetensors
from rstar2_cli.rl.policy import PolicyTrainer
from rstar2_cli.rl.sampler import DataSampler

OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.pt"


def _optim_options(policy: PolicyTrainer, saving: bool) -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=policy.sharded and saving)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class LoadedCheckpoint:
    path: Path
    step: int
    rng: np.random.Generator | None       # the RoC generator, as it was when saved
    extra: dict[str, Any]
    final: bool


def save_checkpoint(target: str | Path, policy: PolicyTrainer, tokenizer=None, sampler: DataSampler | None = None,
                    step: int = 0, rng: np.random.Generator | None = None, *, final: bool = False,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint folder `target` (e.g. out_dir/step_000010) and point out_dir/latest at it."""
    target = Path(target)
    weights = dict(policy.full_state_dict())
    optim = get_optimizer_state_dict(policy.model, policy.optimizer, options=_optim_options(policy, saving=True))
    if policy.info.is_main:
        tmp = target.with_name(f".tmp_{target.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        policy.model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(optim, tmp / OPTIMIZER_FILE)
        torch.save({"step": step, "final": final, "scheduler": policy.scheduler.state_dict(),
                    "sampler": sampler.state_dict() if sampler is not None else None,
                    "roc_rng": rng.bit_generator.state if rng is not None else None,
                    "rng": rng_state(), "extra": extra or {}}, tmp / STATE_FILE)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        (target.parent / "latest").write_text(target.name + "\n")
    rl_dist.barrier()
    return target


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The folder `out_dir/latest` names, else the highest complete step_* folder, else None."""
    out_dir = Path(out_dir)
    latest = out_dir / "latest"
    if latest.is_file():
        named = out_dir / latest.read_text().strip()
        if (named / STATE_FILE).is_file():
            return named
    steps = sorted(p for p in out_dir.glob("step_*") if (p / STATE_FILE).is_file())
    return steps[-1] if steps else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder holding one (see latest_checkpoint)."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path}: not a checkpoint (no {STATE_FILE}, no 'latest', no step_* folder)")
    return found


def load_model_weights(policy: PolicyTrainer, hf_dir: Path) -> None:
    """The checkpoint's weights into the (sharded) policy: each rank reads only its own slices."""
    fill_from_safetensors(policy.model, hf_dir)


def load_checkpoint(path: str | Path, policy: PolicyTrainer, sampler: DataSampler | None = None, *,
                    reset_optimizer: bool = False) -> LoadedCheckpoint:
    """Restore weights, optimizer + LR schedule (unless `reset_optimizer`, e.g. stage 3),
    sampler position and RNG states."""
    step_dir = resolve_checkpoint(path)
    load_model_weights(policy, step_dir)
    state = torch.load(step_dir / STATE_FILE, weights_only=False)
    if not reset_optimizer:
        # Memory-mapped: each rank touches only the pages of its own slices of the moments.
        optim = torch.load(step_dir / OPTIMIZER_FILE, weights_only=False, mmap=True)
        set_optimizer_state_dict(policy.model, policy.optimizer, optim_state_dict=optim,
                                 options=_optim_options(policy, saving=False))
        policy.scheduler.load_state_dict(state["scheduler"])
    if sampler is not None and state["sampler"] is not None:
        sampler.load_state_dict(state["sampler"])
    set_rng_state(state["rng"])
    rng = None
    if state.get("roc_rng") is not None:
        rng = np.random.default_rng()
        rng.bit_generator.state = state["roc_rng"]
    return LoadedCheckpoint(path=step_dir, step=int(state["step"]), rng=rng, extra=state["extra"],
                            final=bool(state.get("final", False)))
