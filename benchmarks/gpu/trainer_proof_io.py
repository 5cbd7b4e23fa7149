"""The checks of benchmarks/gpu/gpu_trainer_proof.py that move state between processes or to disk:
the DCP checkpoint round trip, the engine spawn environment and the CUDA IPC round trip.

Only torch and this source tree are imported (a bare GPU box has no vLLM).
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

# torchrun's agent sets it in every worker (torch/distributed/elastic/agent/server/
# local_elastic_agent.py); a process that inherits it and starts its own TCP rendezvous becomes a
# client of a store nobody serves, and waits until it times out.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
# The function the engine launch wraps its spawn in (rollout/engine_env.py): a context manager
# under which a spawned process does not see torchrun's agent-store variables. Taken with
# sleep_mode=True, as a colocated GPU engine starts.
SCRUB_FUNCTION = "engine_spawn_env"
SCRUB_MODULES = ("rstar2_cli.rollout.engine_env",)


class Skipped(Exception):
    """The check cannot run here; the message says why (gpu_trainer_proof prints it as a skip)."""


def one_rank_group(device: torch.device) -> bool:
    """A 1-rank process group (nccl on CUDA, gloo on CPU) for FSDP2 and DCP, unless one exists;
    whether this call made it."""
    import torch.distributed as dist

    from rstar2_cli.hosts.ports import master_store

    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=master_store(), rank=0, world_size=1)
    return True


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- DCP


def _named_optimizer_state(policy) -> dict[str, dict[str, torch.Tensor]]:
    """AdamW's state per parameter name, as CPU copies."""
    by_param = policy.optimizer.state
    return {name: {k: torch.as_tensor(v).detach().to("cpu", copy=True) for k, v in by_param[p].items()}
            for name, p in policy.model.named_parameters() if p in by_param}


def dcp_round_trip(holder: dict, make_policy, folder: Path, free) -> dict:
    """Save `holder["policy"]` (after an update: AdamW has state) with rl/checkpoint.py, drop it
    (popped from `holder`, so no reference is left), load the folder into `make_policy()` (fresh
    weights), and compare weights, AdamW state and LR schedule bit for bit."""
    from rstar2_cli.rl.checkpoint import STATE_DIR, load_checkpoint, save_checkpoint

    policy = holder.pop("policy")
    folder.mkdir(parents=True, exist_ok=True)
    if not policy.optimizer.state:
        raise AssertionError("the policy has taken no optimizer step: nothing to prove for AdamW")
    # fp32 weights: shards and consolidated files (8 B/param), then files and AdamW moments (4 + 8 B/param)
    need = sum(p.numel() for p in policy.model.parameters()) * 12
    free_bytes = shutil.disk_usage(folder).free
    if free_bytes < need:
        raise AssertionError(f"--work {folder}: {free_bytes / 2**30:.1f} GiB free, the checkpoint needs "
                             f"about {need / 2**30:.1f} GiB")
    target = folder / "step_000001"
    start = time.perf_counter()
    save_checkpoint(target, policy, step=1)
    save_s = time.perf_counter() - start
    weights = {k: v.detach().to("cpu", copy=True) for k, v in policy.model.state_dict().items()}
    moments = _named_optimizer_state(policy)
    schedule = policy.scheduler.state_dict()
    files = sorted(p.name for p in target.glob("*.safetensors"))
    leftovers = sorted(p.name for p in target.iterdir() if p.is_dir() and p.name != STATE_DIR)
    del policy
    free()
    fresh = make_policy()
    start = time.perf_counter()
    loaded = load_checkpoint(target, fresh)
    load_s = time.perf_counter() - start
    got_weights = fresh.model.state_dict()
    weights_differ = [k for k, v in weights.items() if not torch.equal(got_weights[k].cpu(), v)]
    got_moments = _named_optimizer_state(fresh)
    moments_differ = [f"{n}.{k}" for n, state in moments.items() for k, v in state.items()
                      if n not in got_moments or not torch.equal(got_moments[n][k], v)]
    figures = {"save_s": round(save_s, 2), "load_s": round(load_s, 2), "hf_files": len(files),
               "tensors": len(weights), "adamw_entries": sum(len(s) for s in moments.values()),
               "step": loaded.step}
    problems = []
    if not files or leftovers:
        problems.append(f"consolidation: safetensors files {files}, folders left besides {STATE_DIR}: {leftovers}")
    if weights_differ:
        problems.append(f"{len(weights_differ)} weights differ (first {weights_differ[:3]})")
    if moments_differ or len(got_moments) != len(moments):
        problems.append(f"AdamW state differs: {moments_differ[:3]}, {len(got_moments)} of {len(moments)} parameters")
    if fresh.scheduler.state_dict() != schedule:
        problems.append("LR schedule differs")
    del fresh, got_weights
    if problems:
        raise AssertionError("; ".join(problems))
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
    start = time.perf_counter()
    _, args = reduce_tensor(buf)
    spawn = mp.get_context("spawn")
    replies = spawn.Queue()
    child = spawn.Process(target=_ipc_child, args=(args, expected, 7, replies))
    child.start()
    status, seen, child_s = replies.get(timeout=300)
    child.join(timeout=60)
    torch.cuda.synchronize()
    round_trip_s = time.perf_counter() - start
    tail_ok = bool((buf[-4096:] == 7).all())
    figures = {"bytes": n, "round_trip_s": round(round_trip_s, 2), "child_s": round(child_s, 3),
               "child_sum_matches": seen == expected, "parent_sees_child_write": tail_ok}
    del buf
    if status != "ok":
        raise AssertionError(f"child: {seen}")
    if seen != expected or not tail_ok:
        raise AssertionError(f"not one memory: {figures}")
    return figures
