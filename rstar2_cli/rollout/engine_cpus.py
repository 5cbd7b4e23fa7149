"""The environment a vLLM CPU engine-core process starts with: the CPUs it takes, the ones it
leaves to the processes beside it, and no torch.compile when the engine runs eager.

vLLM's CPU worker binds its OpenMP threads to every CPU but the ones it reserves for other
processes (vllm/utils/ompmultiprocessing.py, auto binding: `VLLM_CPU_NUM_OF_RESERVED_CPU`, by
default the engine's local world size, i.e. one CPU beside a TP-1 engine on x86). The engine-core
process's other threads, and the trainer process beside it (rl/ranks/cpu_threads.py), keep their torch
work within that count of threads.

An eager engine (`engine.enforce_eager`, "auto" on CPU) still compiles one helper with
TorchInductor: the sampled token's rank among the logprobs (`batched_count_greater_than`,
vllm/v1/sample/ops/logprobs.py, `torch.compile(backend="inductor")` on CPU), traced and built in
the first engine step that returns logprobs, which every rollout turn asks for. On the 2-core box
(the quickstart's SFT model, 256 sequences x 100 tokens, three engine starts each way, one after
the other) that first batch took 3.4-4.9 s against 1.8-2.0 s with torch.compile off, later
batches the same. The rank is not used by rstar2 and the function is one comparison and a sum, so
the engine-core process of an eager CPU engine starts with `TORCH_COMPILE_DISABLE=1`; the compiled
path stays where the engine compiles its model anyway. That variable, not `TORCHDYNAMO_DISABLE`:
torch reads it once, when `torch._dynamo.config` is imported, which this process has done before
the spawn, whereas `TORCHDYNAMO_DISABLE` is read at every `torch.compile` call and would also
switch off whatever this process compiled while the engine starts.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping

RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
COMPILE_OFF_ENV = "TORCH_COMPILE_DISABLE"


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
def engine_process_env(tensor_parallel_size: int, *, eager: bool, env=os.environ) -> Iterator[None]:
    """Spawn a CPU engine-core process with OMP_NUM_THREADS = the reserved CPUs' count and, for an
    eager engine, TORCH_COMPILE_DISABLE=1 (module docstring); a variable the user set is kept. Its
    model workers' threads are vLLM's: it sets their OMP_NUM_THREADS and affinity itself
    (multiproc_executor: `OMPProcessManager.configure_omp_envs` around each worker's start); the
    engine core, the scheduler on the reserved CPUs, then keeps its torch work to that count.
    Only the spawn sees them: this process's environment is as it was afterwards."""
    wanted = {"OMP_NUM_THREADS": str(reserved_cpus(tensor_parallel_size, env))}
    if eager:
        # lazy: torch's compile config, read now, before the spawn, so this process keeps its setting
        import torch._dynamo.config  # noqa: F401

        wanted[COMPILE_OFF_ENV] = "1"
    added = [name for name in wanted if not env.get(name)]
    for name in added:
        env[name] = wanted[name]
    try:
        yield
    finally:
        for name in added:
            env.pop(name, None)
