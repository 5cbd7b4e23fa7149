"""The CPUs a vLLM CPU engine takes, and the ones it leaves to the processes beside it.

vLLM's CPU worker binds its OpenMP threads to every CPU but the ones it reserves for other
processes (vllm/utils/ompmultiprocessing.py, auto binding: `VLLM_CPU_NUM_OF_RESERVED_CPU`, by
default the engine's local world size, i.e. one CPU beside a TP-1 engine on x86). The engine-core
process's other threads, and the trainer process beside it (rl/cpu_threads.py), keep their torch
work within that count of threads.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping

RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def reserved_cpus(tensor_parallel_size: int, env: Mapping[str, str] = os.environ) -> int:
    """The CPUs vLLM's auto binding leaves to processes other than its workers."""
    raw = env.get(RESERVED_ENV)
    if raw is None or raw == "":
        return max(1, tensor_parallel_size)
    try:
        return max(1, int(raw))
    except ValueError:
        raise ValueError(f"{RESERVED_ENV}={raw!r}: expected an integer number of CPUs") from None


@contextlib.contextmanager
def engine_process_threads(tensor_parallel_size: int, env=os.environ) -> Iterator[None]:
    """Spawn a CPU engine-core process with OMP_NUM_THREADS = the reserved CPUs' count, unless the
    user set it. Its model workers are unaffected: vLLM sets their OMP_NUM_THREADS and affinity
    itself (multiproc_executor: `OMPProcessManager.configure_omp_envs` around each worker's start);
    the engine core, the scheduler on the reserved CPUs, then keeps its torch work to that count."""
    if env.get("OMP_NUM_THREADS"):
        yield
        return
    env["OMP_NUM_THREADS"] = str(reserved_cpus(tensor_parallel_size, env))
    try:
        yield
    finally:
        env.pop("OMP_NUM_THREADS", None)
