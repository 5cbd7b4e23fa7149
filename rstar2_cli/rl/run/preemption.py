"""Preemption: SIGTERM or SIGUSR1 ends an RL run at a step boundary, with a checkpoint, and exit code 75.

Why: clusters warn a job before they kill it. SLURM sends the signal `sbatch --signal=B:USR1@N`
asks for N seconds before the time limit (`rstar2_cli/recipes/slurm_rl.sbatch` forwards it to the trainers),
and SIGTERM on preemption or `scancel`; Kubernetes sends SIGTERM and kills after the pod's
terminationGracePeriodSeconds. A run that checkpoints on the warning loses nothing but the step
in progress, and the requeued job continues with `rstar2 rl --resume auto`.

What happens, in order:
  1. the signal handler (installed by `RLTrainer.train` in the main thread of every trainer
     process) only records the signal and starts the grace clock: the step in progress runs on;
  2. at every step boundary all ranks agree (`PreemptionWatch.agreed`: one all-reduce max of a
     flag over the gloo group; the signal may have reached only some ranks, e.g. one node's), so they stop together;
  3. the trainer writes a checkpoint (the same `save` as a periodic one: with
     `train.max_staleness` >= 1 the rollouts in flight are finished and saved with it, as
     `async_rollouts.py` says) and raises `Preempted`; the process exits with
     `PREEMPTED_EXIT_CODE`;
  4. if the step and the checkpoint have not finished `train.preempt_grace_s` seconds after the
     signal, the process exits at once with the same code and without that checkpoint, so the job
     is still requeued before the cluster's SIGKILL; the requeued run resumes from the previous
     checkpoint (a checkpoint becomes `latest` only once complete: `checkpoint.py`).

Ctrl-C (SIGINT) stops the run the same way, exit code 75 included; a second Ctrl-C at least
`INTERRUPT_REPEAT_S` after the first stops at once (KeyboardInterrupt: the engines are shut down,
no checkpoint). Why the interval: one keypress reaches a torchrun worker twice, from the terminal
(every process of the foreground group) and forwarded by torchrun. The terminal's SIGINT reaches
the engine-core processes too, and vLLM's EngineCore shuts down on it
(vllm/v1/engine/core.py, `signal_handler`): the step then restarts those engines and rolls their
trajectories out again, as for any engine death (below), before the checkpoint.

A run whose last step finishes after the signal ends normally (exit 0): nothing is left to run.
The step in progress is finished, never abandoned half-way (its rollout, update and weight push
are not interrupted), so `preempt_grace_s` must cover one step and one checkpoint; the recipe's
default (600 s) is sized for that, and item 4 bounds what a longer step costs.

Under torchrun the node launcher (`rl/run/launch_entry.py`) forwards SIGTERM and SIGUSR1 to torchrun,
and each node's command carries `torchrun_env` (`rstar2 rl` adds it to the plan): torchrun passes
SIGUSR1 on to the workers too (it passes SIGTERM by default) and waits `preempt_grace_s` plus a
margin before its SIGKILL (its default is 30 s).

Engine processes: vLLM's EngineCore processes take the signal's default action if they receive
it themselves (SIGTERM sent to every process of a job, as SLURM does on preemption), so they may
die while the step finishes. A replica whose engine core dies (or hangs) mid-step is detected and
restarted with the current weights, and the trajectories it interrupted are rolled out again with
their own seeds (`rollout/engine_health.py`, `engine.max_restarts`); the step then ends and the
preemption checkpoint is written as above. Past `engine.max_restarts` the run checkpoints the last
completed step and aborts (exit code 1, `RunAborted`).
"""
from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time

log = logging.getLogger(__name__)

# sysexits.h EX_TEMPFAIL, "temporary failure, indicating something that is not really an error":
# the run was stopped from outside and continues when restarted. rstar2_cli/recipes/slurm_rl.sbatch requeues
# the job on it; any other non-zero exit is a real failure and is not requeued.
PREEMPTED_EXIT_CODE = 75
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# a second Ctrl-C this many seconds or more after the first stops the run at once (module docstring)
INTERRUPT_REPEAT_S = 1.0
# `--resume` values: "latest" (the latest checkpoint, which must exist), "auto" (it if there is one,
# else a fresh start: what a requeued job runs)
RESUME_MODES = ("latest", "auto")
# seconds torchrun waits beyond preempt_grace_s for its workers before it kills them
TORCHRUN_SHUTDOWN_MARGIN_S = 30


class Preempted(Exception):
    """The run stopped on a preemption signal after step `step`; `checkpoint` holds that step
    (written for the signal, or the periodic one of that very step; None: no step ran and there
    is no checkpoint, a resumed run starts fresh)."""

    def __init__(self, step: int, checkpoint, signal_name: str):
        self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "no step ran, no checkpoint"
        super().__init__(f"preempted by {signal_name} after step {step}: {where}; "
                         f"the same command with `--resume auto` continues")


def continue_command(argv: list[str], program: str = "rstar2") -> str:
    """The command line that continues a preempted run: `argv` (a command's own arguments, e.g.
    `rl recipe.yaml --set a=b`) with its `--resume` value, if any, replaced by `--resume auto`."""
    kept, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--resume":
            skip = i + 1 < len(argv) and argv[i + 1] in RESUME_MODES
        elif not arg.startswith("--resume="):
            kept.append(arg)
    return shlex.join([program, *kept, "--resume", "auto"])


def torchrun_env(grace_s: float) -> dict[str, str]:
    """The environment torchrun reads its `--signals-to-handle` and `--shutdown-timeout` from
    (torch.distributed.run: `PET_<FLAG>`): forward SIGUSR1 as well as its defaults, and wait for
    the workers' checkpoint."""
    return {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
            "PET_SHUTDOWN_TIMEOUT": str(int(grace_s) + TORCHRUN_SHUTDOWN_MARGIN_S)}


class PreemptionWatch:
    """The signal handlers and the grace clock of one trainer process (`install`/`uninstall`
    around the step loop; `signal.signal` only works in the main thread, elsewhere it stays
    inert and `agreed` still joins the collective)."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signalled: int | None = None
        self.signalled_at: float | None = None
        self._previous: dict[int, object] = {}
        self._done = threading.Event()
        self._watchdog: threading.Thread | None = None

    def install(self) -> "PreemptionWatch":
        if threading.current_thread() is not threading.main_thread():
            log.warning("preemption: not the main thread, SIGTERM/SIGUSR1 are not handled")
            return self
        for sig in (*PREEMPTION_SIGNALS, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the previous handlers and stop the grace clock (the run is over)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._done.set()

    def _on_signal(self, signum, frame) -> None:
        if self.signalled is not None:
            if signum == signal.SIGINT and time.monotonic() - self.signalled_at >= INTERRUPT_REPEAT_S:
                print("preemption: Ctrl-C again: stopping now, without a checkpoint", file=sys.stderr, flush=True)
                raise KeyboardInterrupt
            return
        self.signalled, self.signalled_at = signum, time.monotonic()
        # stderr directly: a handler must not take the logging module's locks
        again = "; Ctrl-C again stops at once, without one" if signum == signal.SIGINT else ""
        print(f"preemption: {signal.Signals(signum).name}: finishing this step, then a checkpoint "
              f"(at most train.preempt_grace_s={self.grace_s:g} s){again}", file=sys.stderr, flush=True)
        self._watchdog = threading.Thread(target=self._expire, name="rstar2-preempt-grace", daemon=True)
        self._watchdog.start()

    def _expire(self) -> None:
        if not self._done.wait(self.grace_s):
            print(f"preemption: no checkpoint within train.preempt_grace_s={self.grace_s:g} s; exiting "
                  f"with {PREEMPTED_EXIT_CODE}, --resume auto continues from the previous checkpoint",
                  file=sys.stderr, flush=True)
            os._exit(PREEMPTED_EXIT_CODE)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signalled).name if self.signalled is not None else "a peer rank's signal"

    def agreed(self) -> bool:
        """Whether any rank has been signalled; a collective (every rank calls it at the same
        step boundary), so all ranks stop at the same step."""
        # lazy: rl.dist loads torch, and `rstar2 --help` imports this module (commands/rl.py)
        from rstar2_cli.rl.ranks import dist as rl_dist

        if not rl_dist.is_distributed():
            return self.signalled is not None
        # over the gloo group: ranks that reach the boundary first wait on the CPU, not on a GPU
        return rl_dist.agree_max([1.0 if self.signalled is not None else 0.0])[0] > 0
