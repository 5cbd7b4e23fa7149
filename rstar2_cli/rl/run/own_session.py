"""A trainer launched from a terminal runs in a session of its own; its launcher passes signals on.

Why: a terminal sends Ctrl-C's SIGINT to every process of its foreground group, and the vLLM
engine-core processes a trainer starts are in that group: vLLM's EngineCore shuts down on SIGINT
(vllm/v1/engine/core.py, `signal_handler`), so the step in progress would lose its engines. Started in
a new session, the trainer and its engines see no terminal signal; the launcher, left in the
foreground, gets Ctrl-C alone and passes it to the trainer, which finishes the step and checkpoints
(`rl/run/preemption.py`). The launcher also passes on SIGTERM and SIGUSR1 (what SLURM sends), and the
child gets SIGTERM if the launcher dies (`PR_SET_PDEATHSIG`): a closed terminal ends in a
checkpoint too, never in a trainer left running on its own.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping

from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS

_PR_SET_PDEATHSIG = 1    # linux/prctl.h


def at_a_terminal() -> bool:
    """Whether this process is in a terminal's foreground group (Ctrl-C would reach all of it)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def signals_reach_the_child(env: Mapping[str, str]) -> bool:
    """Whether a signal this launcher gets reaches its child (torchrun) without it: as a task of a
    SLURM job step (srun sets SLURM_STEP_ID), slurmstepd signals the task's processes, torchrun
    among them, whichever proctrack plugin the site uses (cgroup: the step's container; linuxproc:
    the task's process tree; pgid: the task's process group)."""
    return bool(env.get("SLURM_STEP_ID"))


def call_forwarding_signals(argv: list[str], env: dict[str, str], *, own_session: bool = False) -> int:
    """Run `argv` (torchrun, or a trainer) and wait for it, passing SIGTERM and SIGUSR1 on to it; if
    one came, the exit code is PREEMPTED_EXIT_CODE unless it succeeded (torchrun itself exits
    non-zero when it is signalled, whatever its workers did).

    Under srun SIGTERM and SIGUSR1 are only noted (`signals_reach_the_child`): passed on as well,
    they reach torchrun twice, and torchrun, which forwards the first to its workers and waits for
    them, takes a second one during that wait as a reason to end them at once: SIGTERM to each
    worker's process group, vLLM's engine cores included, before the step and its checkpoint are
    done (torch/distributed/elastic/agent/server/api.py `run`: the second SignalException skips
    `shutdown_called`, and the `finally` shuts down with the default SIGTERM).

    SIGINT: with `own_session` the child runs in a new session (module docstring) and SIGINT is
    passed on. Without, it is only noted: a terminal's Ctrl-C reaches the child itself, and
    torchrun ends its workers at once on a second SIGINT."""
    proc = subprocess.Popen(argv, env=env, start_new_session=own_session,
                            preexec_fn=_die_with_parent if own_session else None)
    got: list[int] = []
    reached = signals_reach_the_child(env)

    def forward(signum, frame):
        got.append(signum)
        passed_on = own_session if signum == signal.SIGINT else not reached
        if passed_on and proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (*PREEMPTION_SIGNALS, signal.SIGINT)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return PREEMPTED_EXIT_CODE if got and code != 0 else code


def again_in_own_session(module: str, args: list[str]) -> int:
    """`python -m module args` in its own session with signals passed on; its exit code."""
    return call_forwarding_signals([sys.executable, "-m", module, *args], dict(os.environ), own_session=True)
