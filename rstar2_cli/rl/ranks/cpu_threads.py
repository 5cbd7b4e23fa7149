"""torch's threads for a trainer on CPU that shares the machine with its vLLM engine.

vLLM's CPU worker binds its OpenMP threads to every CPU but the ones it reserves for the other
processes (vllm/utils/ompmultiprocessing.py, auto binding: `VLLM_CPU_NUM_OF_RESERVED_CPU`, by
default the engine's local world size, i.e. one CPU beside a TP-1 engine on x86). The trainer's
own torch threads default to every CPU, so torch work of the trainer process while the engine
decodes runs OpenMP threads on the engine's cores: the update at `train.max_staleness >= 1`
overlaps the next batch's rollouts. Measured on the 2-core quickstart (seed 0, 8 steps, one
invocation after another, load 1.5-2.2): k = 1 step 3.45 s with this plan against 6.95 s at
torch's default (update 2.25 against 4.65 s, the next batch's rollouts 5.9 against 11.2 s, the
same losses); k = 0 4.98 against 5.07 s (no change beyond noise: rollouts 3.9 against 4.2 s, the
update 1.0 against 0.8 s).

So with `train.cpu_threads: auto` a rollout host training on CPU keeps to the reserved CPUs'
count of threads while its engines decode, and at k = 0 the update, during which they are idle,
takes every CPU again; its engine-core processes start with the same count (rollout/engine_cpus.py).
`all` keeps torch's default throughout. GPU trainers are left alone.

torch.set_num_threads sets the calling thread's OpenMP team size and the process default that
other threads take at their first parallel region (ATen's lazy_init_num_threads), so the plan is
applied before the rollout service starts its thread, and `alone()` changes only the trainer's
(main) thread for the update.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping

import torch

from rstar2_cli.rollout.engine_cpus import reserved_cpus

class TrainerThreads:
    """The trainer process's torch threads beside engines on the same CPUs (module docstring)."""

    def __init__(self, plan: str, device: torch.device, *, engines_here: bool, overlapped: bool = False,
                 tensor_parallel_size: int = 1, env: Mapping[str, str] = os.environ):
        self.all = torch.get_num_threads()
        self.active = plan == "auto" and device.type == "cpu" and engines_here
        self.beside = min(self.all, reserved_cpus(tensor_parallel_size, env)) if self.active else self.all
        self.overlapped = overlapped     # rollouts run during the update (asynchronous RL)
        if self.active:
            torch.set_num_threads(self.beside)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """The synchronous update: the engines are idle meanwhile, so it takes every CPU."""
        if not self.active or self.overlapped or self.beside == self.all:
            yield
            return
        torch.set_num_threads(self.all)
        try:
            yield
        finally:
            torch.set_num_threads(self.beside)

    def restore(self) -> None:
        """torch's default again (the trainer closes)."""
        if self.active:
            torch.set_num_threads(self.all)
