"""RL checkpoints: a servable HF folder plus everything `--resume` needs to continue exactly.

A checkpoint folder (e.g. `<out_dir>/step_000010` or `<out_dir>/final`) IS a plain HF model
folder, so `vllm serve`, `from_pretrained` and the next stage's `model.path` load it directly:
  config.json, generation_config.json, tokenizer files
  model-0000i-of-0000N.safetensors + model.safetensors.index.json   the fp32 weights
  state/      a torch.distributed.checkpoint (DCP) folder: `.metadata` and one `__<rank>_0.distcp`
              file per rank holding that rank's shards of the AdamW moments
              (`get_optimizer_state_dict(full_state_dict=False)`: keyed by parameter name, so DCP
              reshards it to any world size on load) and, written by rank 0, the trainer state:
              step, LR scheduler, DataSampler position, the RoC numpy Generator,
              python/numpy/torch RNG states and a caller `extra` dict (`read_trainer_state`)
Every rank writes its own shards; no rank gathers the full weights or the full optimizer state.
The weights are written by DCP's HuggingFaceStorageWriter: each rank writes its shards into
`sharded/`, then rank 0 consolidates them into the HF files one tensor at a time (its peak is
the largest tensor, torch/distributed/checkpoint/_consolidate_hf_safetensors.py) and `sharded/`
is deleted. All ranks must reach the same folder (a shared file system in multi-node runs, as
rl/update/model_load.py's sliced loading assumes already).

Atomicity: a folder is written under `.tmp_<name>` and renamed when every rank's part is on
disk; `<out_dir>/latest` (replaced atomically) then names it. A write that fails on any rank
(a full disk, any OSError) raises `CheckpointWriteError` on every rank, deletes the partial
folder and leaves the previous checkpoint and `latest` as they were.
`keep` (train.keep_checkpoints) prunes the oldest step_* folders after a save, never the one
`latest` names nor `final`.
Fault injection (`faults.FaultPlan.checkpoint_write_step`): `save_checkpoint(fail_write=True)` fails
part-way with OSError(ENOSPC), after the weights and the other ranks' state shards are written.
All ranks must call save/load (both are collectives).
"""
from __future__ import annotations

import errno
import io
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.update.model_load import tied_sources, fill_from_safetensors
from rstar2_cli.rl.update.policy import PolicyTrainer

STATE_DIR = "state"
# HF's own default shard size (`save_pretrained(max_shard_size="50GB")` in transformers 5 is larger;
# 5 GB files keep rank 0's consolidation and vLLM's per-file loading modest)
MAX_FILE_BYTES = 5 * 1024**3
_SHARDED_OPTIONS = StateDictOptions(full_state_dict=False)


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (one line: where, why); the previous one is intact."""


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


class _FullDiskWriter(dcp.FileSystemWriter):
    """FileSystemWriter whose last rank writes its files, then fails as a full disk would."""

    def write_data(self, plan, planner):
        result = super().write_data(plan, planner)
        info = rl_dist.process_info()
        if info.rank == max(info.world_size - 1, 0):
            raise OSError(errno.ENOSPC, "No space left on device (injected: FaultPlan.checkpoint_write_step)")
        return result


def _dcp(fn: Callable, *args, **kwargs):
    """dcp.save/dcp.load, without a process group in a single process (DCP then warns on every
    call that it assumes one process: that is this path, not news)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return fn(*args, no_dist=not rl_dist.is_distributed(), **kwargs)


def _os_error(e: BaseException) -> OSError | None:
    """`e` if an OSError, or the first rank's OSError inside DCP's CheckpointException (which
    every rank raises when any rank's write failed); else None."""
    if isinstance(e, OSError):
        return e
    for rank in sorted(getattr(e, "failures", {}) or {}):
        exc = e.failures[rank][0]
        if isinstance(exc, OSError):
            return exc
    return None


def _collective(where: str, fn: Callable[[], Any]) -> Any:
    """Run `fn` on every rank; if it fails on any rank with an OSError (DCP's own writes: wrapped in
    its CheckpointException), every rank raises the same CheckpointWriteError, so no rank is left
    waiting in a collective. Other exceptions are bugs and propagate."""
    err, out = None, None
    try:
        out = fn()
    except (OSError, dcp.CheckpointException) as e:
        cause = _os_error(e)
        if cause is None:
            raise
        err = f"{where}: {type(cause).__name__}: {cause}"
    errors = [x for x in rl_dist.all_gather_objects(err) if x]
    if errors:
        raise CheckpointWriteError(errors[0].splitlines()[0])
    return out


def _weights_state(policy: PolicyTrainer) -> dict[str, torch.Tensor]:
    """This rank's shards of the weights (DTensors when sharded), tied aliases left out as
    `save_pretrained` does (safetensors holds no aliases; the model re-ties them on load)."""
    sd = get_model_state_dict(policy.model, options=_SHARDED_OPTIONS)
    for alias, source in tied_sources(policy.model).items():
        if alias in sd and source in sd:
            del sd[alias]
    return sd


def file_index(state: dict[str, torch.Tensor], max_bytes: int = MAX_FILE_BYTES) -> dict[str, int]:
    """{name: 1-based output file}, in state order, a new file once `max_bytes` would be passed
    (the global size: a DTensor's shape is the full one)."""
    index, used, current = {}, 0, 1
    for name, value in state.items():
        size = value.numel() * value.element_size()
        if used and used + size > max_bytes:
            current, used = current + 1, 0
        index[name] = current
        used += size
    return index


def _write_hf_config(policy: PolicyTrainer, folder: Path, tokenizer) -> None:
    """config.json (dtype and architectures as `save_pretrained` sets them), generation_config.json
    and the tokenizer files; rank 0 only."""
    model = policy.model
    model.config.dtype = str(next(model.parameters()).dtype).split(".")[1]
    model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
    model.config.save_pretrained(folder)
    if model.can_generate():
        model.generation_config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _trainer_state(policy, sampler_state, step, rng, final, extra, has_optimizer_state) -> dict[str, Any]:
    return {"step": step, "final": final, "scheduler": policy.scheduler.state_dict(),
            "sampler": sampler_state,
            "roc_rng": rng.bit_generator.state if rng is not None else None,
            "rng": rng_state(), "extra": extra or {}, "has_optimizer_state": has_optimizer_state}


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _has_optimizer_state(policy: PolicyTrainer) -> bool:
    """Whether AdamW has taken a step. Before one, `get_optimizer_state_dict` would create the state
    with a zero-gradient step (torch's `_init_optim_state`: step 1), changing the next update."""
    return bool(rl_dist.all_reduce_max([float(bool(policy.optimizer.state))], policy.device)[0])


def save_checkpoint(target: str | Path, policy: PolicyTrainer, tokenizer=None, sampler_state: dict | None = None,
                    step: int = 0, rng: np.random.Generator | None = None, *, final: bool = False,
                    extra: dict[str, Any] | None = None, keep: int = 0, fail_write: bool = False) -> Path:
    """Write a checkpoint folder `target` (e.g. out_dir/step_000010), point out_dir/latest at it and
    keep the newest `keep` step folders (0: all). Raises CheckpointWriteError (every rank) if a
    write fails; then nothing on disk has changed. `fail_write`: the write fails part-way as a full
    disk would (fault injection, `faults.FaultPlan`)."""
    target = Path(target)
    main = policy.info.is_main
    tmp = target.with_name(f".tmp_{target.name}")
    try:
        def prepare():
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                _write_hf_config(policy, tmp, tokenizer)
        _collective(f"checkpoint {target}: writing config", prepare)

        weights = _weights_state(policy)
        writer = dcp.HuggingFaceStorageWriter(str(tmp), fqn_to_index_mapping=file_index(weights),
                                              save_distributed=True, enable_consolidation=True)
        _collective(f"checkpoint {target}: writing weights", lambda: _dcp(dcp.save, weights, storage_writer=writer))
        del weights
        if main:   # the per-rank shards, now consolidated into the HF files
            shutil.rmtree(writer.path, ignore_errors=True)

        has_optim = _has_optimizer_state(policy)
        state: dict[str, Any] = {}
        if has_optim:
            state["optimizer"] = get_optimizer_state_dict(policy.model, policy.optimizer, options=_SHARDED_OPTIONS)
        if main:
            # one opaque entry (DCP would flatten a dict into keys a loader must know in advance)
            state["trainer"] = _to_bytes(_trainer_state(policy, sampler_state, step, rng, final, extra, has_optim))
        state_writer = (_FullDiskWriter if fail_write else dcp.FileSystemWriter)(str(tmp / STATE_DIR))
        _collective(f"checkpoint {target}: writing optimizer and trainer state",
                    lambda: _dcp(dcp.save, state, storage_writer=state_writer))
        del state

        def publish():
            if main:
                _replace_folder(tmp, target)
                latest = target.parent / "latest"
                latest_tmp = target.parent / ".latest.tmp"
                latest_tmp.write_text(target.name + "\n")
                os.replace(latest_tmp, latest)
        _collective(f"checkpoint {target}: publishing", publish)
    except CheckpointWriteError as e:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(target.parent)
        raise CheckpointWriteError(f"{e}; latest is still {previous if previous is not None else 'none'}") from None
    if main and keep > 0:
        prune_checkpoints(target.parent, keep)
    rl_dist.barrier()
    return target


def _replace_folder(tmp: Path, target: Path) -> None:
    """Rename `tmp` to `target`; an existing `target` (a re-saved `final`) is moved aside first
    and deleted only once the new one is in place."""
    old = target.with_name(f".old_{target.name}")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def is_checkpoint(folder: Path) -> bool:
    return (Path(folder) / STATE_DIR / ".metadata").is_file()


def _step_folders(out_dir: Path) -> list[Path]:
    """Complete step_<n> folders, oldest first (by n)."""
    found = []
    for p in out_dir.glob("step_*"):
        suffix = p.name.removeprefix("step_")
        if suffix.isdigit() and is_checkpoint(p):
            found.append((int(suffix), p))
    return [p for _, p in sorted(found)]


def prune_checkpoints(out_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step_* folders, never the one `latest` names nor `final`;
    returns the deleted folders."""
    if keep < 1:
        raise ValueError(f"keep={keep}: expected >= 1 (0 means keep all and prunes nothing)")
    out_dir = Path(out_dir)
    latest = latest_checkpoint(out_dir)
    steps = _step_folders(out_dir)
    doomed = [p for p in steps[:-keep] if p != latest and p.name != "final"]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def complete_step_folders(out_dir: str | Path) -> list[Path]:
    """The complete step_<n> folders of a run, oldest first."""
    return _step_folders(Path(out_dir))


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The folder `out_dir/latest` names, else the highest complete step_* folder, else None."""
    out_dir = Path(out_dir)
    latest = out_dir / "latest"
    if latest.is_file():
        named = out_dir / latest.read_text().strip()
        if is_checkpoint(named):
            return named
    steps = _step_folders(out_dir)
    return steps[-1] if steps else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder, or a run folder holding one (see latest_checkpoint)."""
    path = Path(path)
    if is_checkpoint(path):
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"{path}: not a checkpoint (no {STATE_DIR}/.metadata, no 'latest', "
                                "no step_* folder)")
    return found


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """The trainer state of a checkpoint folder (step, scheduler, sampler, RNG states, extra);
    every rank reads it (a collective under torchrun)."""
    box: dict[str, Any] = {"trainer": b""}
    _dcp(dcp.load, box, storage_reader=dcp.FileSystemReader(str(Path(path) / STATE_DIR)))
    return torch.load(io.BytesIO(box["trainer"]), weights_only=False)


def load_model_weights(policy: PolicyTrainer, hf_dir: Path) -> None:
    """The checkpoint's weights into the (sharded) policy: each rank reads only its own slices."""
    fill_from_safetensors(policy.model, hf_dir)


def _load_optimizer(step_dir: Path, policy: PolicyTrainer, state: dict[str, Any]) -> None:
    """The checkpoint's AdamW state (moments, step counts, param-group settings) into the policy."""
    if state["has_optimizer_state"]:
        # the template (this rank's shards, allocated by torch) is filled in place by DCP
        optim = {"optimizer": get_optimizer_state_dict(policy.model, policy.optimizer, options=_SHARDED_OPTIONS)}
        _dcp(dcp.load, optim, storage_reader=dcp.FileSystemReader(str(step_dir / STATE_DIR)))
        set_optimizer_state_dict(policy.model, policy.optimizer, optim_state_dict=optim["optimizer"],
                                 options=_SHARDED_OPTIONS)
    else:   # saved before the first optimizer step: AdamW starts fresh, as it had
        policy.optimizer.state.clear()


def continue_optimizer(path: str | Path, policy: PolicyTrainer) -> int:
    """A stage that continues the previous one (`init_from`, rl/run/stages.py): the previous stage's
    AdamW moments and LR-schedule position into `policy`, whose weights already came from the same
    folder (`model.path`). The new recipe's optimizer settings (optim.lr, betas, weight_decay) win
    over the saved ones, and its LR schedule continues from the saved position (a warm-up already
    done is not repeated). Data order, RNG states and the step count are the new stage's own.
    Returns the schedule position (LR steps taken so far)."""
    step_dir = resolve_checkpoint(path)
    state = read_trainer_state(step_dir)
    _load_optimizer(step_dir, policy, state)
    cfg, groups = policy.optim_cfg, policy.optimizer.param_groups
    position = int(state["scheduler"]["last_epoch"])
    lambdas = policy.scheduler.lr_lambdas
    lrs = [cfg.lr * lam(position) for lam in lambdas]
    for group, lr in zip(groups, lrs):
        group.update(lr=lr, initial_lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    policy.scheduler.load_state_dict({**state["scheduler"], "base_lrs": [cfg.lr] * len(groups), "_last_lr": lrs})
    return position


def load_checkpoint(path: str | Path, policy: PolicyTrainer, sampler: Any = None, *,
                    reset_optimizer: bool = False) -> LoadedCheckpoint:
    """Restore weights, optimizer + LR schedule (unless `reset_optimizer`, e.g. stage 3),
    sampler position (`sampler`: the run's DataSampler, rl/run/sampler.py) and RNG states, at any world size."""
    step_dir = resolve_checkpoint(path)
    load_model_weights(policy, step_dir)
    state = read_trainer_state(step_dir)
    if not reset_optimizer:
        _load_optimizer(step_dir, policy, state)
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
