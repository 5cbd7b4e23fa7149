"""The preemption warning, SIGUSR1, is the trainer's alone: the processes it spawns start with it blocked.

Why: SLURM delivers a signal sent to a job step (srun forwarding the batch script's USR1, or
`scancel --signal`) to every process of the step, not only to the task srun started: slurmd's
`_rpc_signal_tasks` has slurmstepd signal the step's whole process container (proctrack). The
trainers checkpoint on USR1 (rl/run/preemption.py), but USR1's default action ends a process, and
vLLM's engine core handles only SIGTERM and SIGINT (vllm/v1/engine/core.py, `signal.signal`
calls), so the warning killed every node's engines mid-step; with several trainer ranks a dead
engine fails the step, and the preempted run lost the step and its checkpoint (the CPU rehearsal
of rstar2_cli/recipes/slurm_rl.sbatch, tests/rehearsal/, runs that path). A process started with
USR1 blocked never acts on it: the signal mask is inherited across fork and kept across exec
(signal(7)), and multiprocessing's spawn, fork and forkserver all start their process from the
calling thread. The caller's own mask is restored afterwards; a USR1 that arrives meanwhile waits
(pending) or goes to another thread, and is handled as usual.
"""
from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

SHIELDED = frozenset({signal.SIGUSR1})


@contextlib.contextmanager
def children_shielded() -> Iterator[None]:
    """Processes started by this thread inside the block have SHIELDED blocked for good."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
