"""`RSTAR2_CPU_RANKS=1`: the ranks of a GPU launch run on CPU.

Why: `rstar2 rl --gpus N` under SLURM (rstar2_cli/recipes/slurm_rl.sbatch) is the paper's launch,
and a machine without GPUs (CI, a laptop) must be able to rehearse it whole: the same plan, the
same torchrun line per node, the same trainer code. With the variable set, each of the N "GPUs"
is one CPU rank: the ranks join a gloo group on the CPU device, each node's rollout host starts
its engine on vLLM's CPU build, and no GPU memory plan is made. It is read only where a device,
backend or memory plan is chosen: `rstar2 rl` (commands/rl.py: the recipe's placement and the
plan), the plan's nodes (launch/topology.py: their ranks see no GPU) and `rl/ranks/dist.py` (gloo, the
CPU device). torchrun's workers and the engines they spawn inherit it with the node's environment.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

CPU_RANKS_ENV = "RSTAR2_CPU_RANKS"
_ON, _OFF = ("1", "true", "yes"), ("", "0", "false", "no")


def cpu_ranks(env: Mapping[str, str] | None = None) -> bool:
    """Whether RSTAR2_CPU_RANKS asks for CPU ranks; ValueError (one line) for a value that is
    neither on (1, true, yes) nor off (unset, empty, 0, false, no)."""
    raw = (os.environ if env is None else env).get(CPU_RANKS_ENV, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"{CPU_RANKS_ENV}={raw!r}: expected 1 (ranks on CPU) or 0")
