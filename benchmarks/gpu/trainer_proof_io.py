"""The checks of benchmarks/gpu/gpu_trainer_proof.py that move state between processes or to disk:
the DCP checkpoint round trip, the engine spawn environment and the CUDA IPC round trip.

Only torch and the light modules of this source tree are imported (the lent GPU image has no vLLM).
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from harness import Stopwatch
from trainer_proof_model import CheckFailed, Skipped, full
from rstar2_cli.rl.update.checkpoint import STATE_DIR, load_checkpoint, save_checkpoint

# torchrun's agent sets it in every worker (torch/distributed/elastic/agent/server/
# local_elastic_agent.py); a process that inherits it and starts its own TCP rendezvous becomes a
# client of a store nobody serves, and waits until it times out.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
# The function the engine launch wraps its spawn in (rollout/engine_env.py): a context manager
# under which a spawned process does not see torchrun's agent-store variables. Taken with
# sleep_mode=True, as a colocated GPU engine starts.
SCRUB_FUNCTION = "engine_spawn_env"
SCRUB_MODULES = ("rstar2_cli.rollout.engine_env",)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- DCP


def _cpu_copy(value) -> torch.Tensor:
    """A full CPU copy of a tensor, DTensor (gathered: a collective) or number."""
    return full(torch.as_tensor(value).detach()).to("cpu", copy=True)


def _named_optimizer_state(policy) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW's state per parameter name, as full CPU copies."""
    by_param = policy.optimizer.state
    return {name: {k: _cpu_copy(v) for k, v in by_param[p].items()}
            for name, p in policy.model.named_parameters() if p in by_param}


def dcp_paths(folder: Path) -> dict[str, Path]:
    """Where the DCP check writes: the checkpoint folder (`step_000001`, as rl/update/checkpoint.py names
    steps) and its AdamW/trainer state folder."""
    target = folder / "step_000001"
    return {"target": target, "state": target / STATE_DIR}


def dcp_bytes_needed(params: int) -> int:
    """Disk the check needs at its peak: fp32 weights as shards and consolidated (8 B/param), then
    files and AdamW moments (4 + 8 B/param)."""
    return params * 12


def dcp_verdict(figures: dict) -> None:
    problems = []
    if not figures["hf_files"] or figures["leftover_folders"]:
        problems.append(f"consolidation: {figures['hf_files']} safetensors files, folders left besides the state: "
                        f"{figures['leftover_folders']}")
    if figures["weights_differing"]:
        problems.append(f"{figures['weights_differing']} weights differ (first {figures['first_differing']})")
    if figures["adamw_differing"] or figures["adamw_params_loaded"] != figures["adamw_params_saved"]:
        problems.append(f"AdamW state differs: {figures['adamw_differing']} entries, {figures['adamw_params_loaded']}"
                        f" of {figures['adamw_params_saved']} parameters")
    if not figures["schedule_equal"]:
        problems.append("LR schedule differs")
    if problems:
        raise CheckFailed("; ".join(problems), figures)


def dcp_round_trip(holder: dict, make_policy, folder: Path, free) -> dict:
    """Save `holder["policy"]` (after an update: AdamW has state) with rl/update/checkpoint.py, drop it
    (popped from `holder`, so no reference is left), load the folder into `make_policy()` (fresh
    weights), and compare weights, AdamW state and LR schedule bit for bit. The folder stays (the
    engine-headroom check continues its optimizer state)."""
    policy = holder.pop("policy")
    paths = dcp_paths(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if not policy.optimizer.state:
        raise AssertionError("the policy has taken no optimizer step: nothing to prove for AdamW")
    need = dcp_bytes_needed(sum(p.numel() for p in policy.model.parameters()))
    free_bytes = shutil.disk_usage(folder).free
    if free_bytes < need:
        raise AssertionError(f"--work {folder}: {free_bytes / 2**30:.1f} GiB free, the checkpoint needs "
                             f"about {need / 2**30:.1f} GiB")
    with Stopwatch() as save:
        save_checkpoint(paths["target"], policy, step=1)
    save_s = save.seconds
    weights = {k: _cpu_copy(v) for k, v in policy.model.state_dict().items()}
    moments = _named_optimizer_state(policy)
    schedule = policy.scheduler.state_dict()
    files = sorted(p.name for p in paths["target"].glob("*.safetensors"))
    leftovers = sorted(p.name for p in paths["target"].iterdir() if p.is_dir() and p != paths["state"])
    del policy
    free()
    fresh = make_policy()
    with Stopwatch() as load:
        loaded = load_checkpoint(paths["target"], fresh)
    load_s = load.seconds
    got_weights = fresh.model.state_dict()
    weights_differ = [k for k, v in weights.items() if not torch.equal(_cpu_copy(got_weights[k]), v)]
    got_moments = _named_optimizer_state(fresh)
    moments_differ = [f"{n}.{k}" for n, state in moments.items() for k, v in state.items()
                      if n not in got_moments or not torch.equal(got_moments[n][k], v)]
    figures = {"save_s": round(save_s, 2), "load_s": round(load_s, 2), "hf_files": len(files),
               "leftover_folders": leftovers, "tensors": len(weights), "weights_differing": len(weights_differ),
               "first_differing": weights_differ[:3], "adamw_entries": sum(len(s) for s in moments.values()),
               "adamw_differing": len(moments_differ), "adamw_params_saved": len(moments),
               "adamw_params_loaded": len(got_moments),
               "schedule_equal": fresh.scheduler.state_dict() == schedule, "step": loaded.step}
    del fresh, got_weights
    dcp_verdict(figures)
    return figures


# ---------------------------------------------------------------- spawn environment


def _scrub_function():
    """(function, module name), or (None, why not) when no module has it."""
    why = []
    for name in SCRUB_MODULES:
        try:
            fn = getattr(importlib.import_module(name), SCRUB_FUNCTION, None)
        except ImportError as e:      # a bare GPU box: the module needs what is not installed
            why.append(f"{name} does not import ({e})")
            continue
        if fn is not None:
            return fn, name
        why.append(f"no {SCRUB_FUNCTION}() in {name}")
    return None, "; ".join(why)


def spawn_env_check() -> dict:
    """As a torchrun worker: the variable set; a child spawned inside the engine launch's scrub
    (`SCRUB_FUNCTION`) must not see it. The child is a fresh interpreter, as a vLLM engine core
    spawned with multiprocessing's "spawn" start method is; both inherit os.environ at the spawn."""
    fn, module = _scrub_function()
    if fn is None:
        raise Skipped(module)
    probe = [sys.executable, "-c", f"import os; print(os.environ.get({AGENT_STORE_ENV!r}, '<unset>'))"]
    before = os.environ.get(AGENT_STORE_ENV)
    os.environ[AGENT_STORE_ENV] = "True"
    try:
        unscrubbed = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
        with fn(sleep_mode=True):
            seen = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
        restored = os.environ.get(AGENT_STORE_ENV)
    finally:
        if before is None:
            os.environ.pop(AGENT_STORE_ENV, None)
        else:
            os.environ[AGENT_STORE_ENV] = before
    figures = {"function": f"{module}.{SCRUB_FUNCTION}", "child_without_scrub": unscrubbed,
               "child_in_scrub": seen, "parent_after": restored}
    if unscrubbed != "True":
        raise AssertionError(f"the probe child did not inherit {AGENT_STORE_ENV} at all: {figures}")
    if seen != "<unset>":
        raise AssertionError(f"an engine spawned under {SCRUB_FUNCTION}() sees {AGENT_STORE_ENV}={seen}")
    return figures


# ---------------------------------------------------------------- CUDA IPC


def _ipc_child(args, expected_sum: int, marker: int, replies) -> None:
    """Rebuild the exported buffer (as vLLM's ipc consumer does: rebuild_cuda_tensor, device index
    at position 6), check its contents, write a marker into its tail, and say so."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        torch.cuda.set_device(0)
        args = list(args)
        args[6] = 0
        start = time.perf_counter()
        buf = rebuild_cuda_tensor(*args)
        seen = int(buf.sum(dtype=torch.int64))
        buf[-4096:] = marker
        torch.cuda.synchronize()
        replies.put(("ok", seen, time.perf_counter() - start))
        del buf
    except Exception as e:   # reported to the parent, which fails the check
        replies.put(("error", f"{type(e).__name__}: {e}", 0.0))


def cuda_ipc_round_trip(gib: float, cuda: bool) -> dict:
    """Export `gib` GiB of CUDA memory with torch's reduce_tensor, rebuild it in a spawned process:
    the child reads the parent's bytes, and the parent sees the child's write (one memory)."""
    if not cuda:
        raise Skipped("needs CUDA")
    import torch.multiprocessing as mp
    from torch.multiprocessing.reductions import reduce_tensor

    n = int(gib * 2**30)
    gen = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen)
    expected = int(buf.sum(dtype=torch.int64))
    torch.cuda.synchronize()
    round_trip = Stopwatch()
    _, args = reduce_tensor(buf)
    spawn = mp.get_context("spawn")
    replies = spawn.Queue()
    child = spawn.Process(target=_ipc_child, args=(args, expected, 7, replies))
    child.start()
    status, seen, child_s = replies.get(timeout=300)
    child.join(timeout=60)
    torch.cuda.synchronize()
    round_trip_s = round_trip.elapsed()
    tail_ok = bool((buf[-4096:] == 7).all())
    figures = {"bytes": n, "round_trip_s": round(round_trip_s, 2), "child_s": round(child_s, 3),
               "child_sum_matches": seen == expected, "parent_sees_child_write": tail_ok}
    del buf
    if status != "ok":
        raise CheckFailed(f"child: {seen}", figures)
    ipc_verdict(figures)
    return figures


def ipc_verdict(figures: dict) -> None:
    if not (figures["child_sum_matches"] and figures["parent_sees_child_write"]):
        raise CheckFailed("not one memory: the child read other bytes or the parent misses its write", figures)
