"""Engine death: a vLLM replica whose engine core dies or stops answering mid-rollout is noticed
within a bounded time, restarted with the current weights, and the trajectories it interrupted
are rolled out again from their prompts (with their own seeds where requests carry them).

Detection (`HealthWatch`, one per `VLLMEngine`), every `engine.health_check_s` while a request
waits, on the engine's own loop:
  * dead: vLLM's own flag, `AsyncLLM.errored` (vllm/v1/engine/async_llm.py: the engine core client's
    `resources.engine_dead`, which its `MPClientEngineMonitor` thread sets within about a second
    of the engine-core process exiting (`CoreEngineProcManager.monitor_engine_liveness` waits on
    the process sentinels with a 1 s timeout), or the output handler task having ended). vLLM
    may also raise `EngineDeadError` from `generate` itself; both become `EngineDied`;
  * hung: requests in flight and no engine step for `engine.health_timeout_s` seconds (a step is
    what vLLM's stat loggers are called on: `VLLMEngine`'s logger calls `beat`), except while the
    engine is paused for a weight update (asynchronous RL queues requests then, by design).
So a death is seen within health_check_s (plus vLLM's 1 s), a hang within health_timeout_s plus
health_check_s. The waiting request then raises `EngineDied` at once; the vLLM request is left to
the old engine core, which the restart shuts down.

Recovery (`EngineSupervisor`, one per rollout host, on the rollout loop): the first trajectory
that sees `EngineDied` starts the replica's restart (`VLLMEngine.restart`: a fresh `AsyncLLM` from
the same engine arguments) in a worker thread; every interrupted trajectory waits for it, is reset
to its prompt and rolled out again from its first turn with its own seed (`agent_loop`). Where
requests carry their seeds (`rollout.seed_requests`: on CPU under auto) vLLM samples a seeded
request deterministically, so the step's data is what an unfailed run gives; on GPU under auto
the engine seed drives the sampler (rollout/generation.py), and a re-rolled trajectory is a fresh
sample of the same policy and prompt: the step's data is as an unfailed run would draw it, not the
same tokens.
Finished trajectories are kept. The restarted engine gets the weights the live ones hold: the
trainer's current policy, through the chunked weight-sync path (`weight_sync.chunked`), stamped
with the current `weights_version`. A restart and a change of the policy's weights (update and
push) hold the same lock (`EngineSupervisor.lock`), so a restart never reads weights mid-update.
Restarts are counted (`faults/engine_restarts`); one beyond `engine.max_restarts` in a run raises
`EngineRestartsExhausted` instead, and the trainer checkpoints the last completed step and aborts
(`RunAborted`, exit code 1). A restart needs the policy's full weights without a collective: a
sharded (multi-rank) policy, or vLLM's own weight transfer (`engine.weight_transfer` ipc or nccl,
whose transfer groups include the dead engine's workers), cannot be restarted mid-step and abort
the same way at the first death (`EngineSupervisor(why_not=...)`; with several ranks the hosts'
exchange turns that into a failed step on every rank, and the run resumes from its last checkpoint).

Finding the engine-core process (fault injection, benchmarks/compare/chaos_rl.py): `AsyncLLM` always runs
the engine core in a child process of the trainer (vllm/v1/engine/utils.py starts it as a
multiprocessing process named "EngineCore", and vllm/v1/engine/core.py sets its process title to
"VLLM::EngineCore"; on CPU the model runs inside it: VLLM_ENABLE_V1_MULTIPROCESSING=0 only keeps
the worker in that process). `engine_core_processes()` lists them: the psutil children of a process
whose name or command line contains "EngineCore". SIGKILL of one is exactly the death above.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache

log = logging.getLogger(__name__)

ENGINE_CORE_MARK = "EngineCore"


class EngineDied(RuntimeError):
    """A replica's engine core died or hung; `engine` is the replica, `generation` its restart
    count when it was seen (a report about an engine since restarted needs no new restart)."""

    def __init__(self, reason: str, engine: Any = None, generation: int = 0):
        super().__init__(reason)
        self.reason, self.engine, self.generation = reason, engine, generation


class EngineRestartsExhausted(RuntimeError):
    """An engine died and may not be restarted (the one-line message says why)."""


def engine_core_processes(pid: int | None = None) -> list[Any]:
    """vLLM engine-core processes among the descendants of `pid` (default: this process), as
    `psutil.Process` objects (module docstring)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if ENGINE_CORE_MARK in child.name() or any(ENGINE_CORE_MARK in a for a in child.cmdline()):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _is_engine_dead_error(e: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError  # lazy: vLLM: imported only where it runs

    return isinstance(e, EngineDeadError)


class HealthWatch:
    """The death and hang checks of one replica. `errored()`: vLLM's `AsyncLLM.errored`;
    `paused()`: paused for a weight update; `check_s`/`timeout_s`: engine.health_check_s and
    engine.health_timeout_s. `guard` runs on the replica's event loop."""

    def __init__(self, errored: Callable[[], bool], paused: Callable[[], bool], *, check_s: float,
                 timeout_s: float, clock: Callable[[], float] = time.monotonic):
        if not 0 < check_s <= timeout_s:
            raise ValueError(f"health check every {check_s} s, hang after {timeout_s} s: need 0 < check <= timeout")
        self.errored, self.paused, self.check_s, self.timeout_s, self.clock = errored, paused, check_s, timeout_s, clock
        self.last_progress = clock()
        self.waiting = 0                # requests inside `guard`
        self.generation = 0             # restarts of the replica so far
        self.failed: str | None = None  # why it counts as dead, once it does

    def beat(self) -> None:
        """The engine made a step (called from vLLM's stat-logger callback)."""
        self.last_progress = self.clock()

    def reset(self) -> None:
        """A fresh engine core: healthy, progress counted from now."""
        self.generation += 1
        self.failed = None
        self.last_progress = self.clock()

    def failure(self) -> str | None:
        """Why the replica counts as dead now, or None."""
        if self.failed is None:
            now = self.clock()
            if self.errored():
                self.failed = "vLLM reports its engine core dead (AsyncLLM.errored: the EngineCore process exited)"
            elif self.paused():
                self.last_progress = now          # paused for a weight update: no steps by design
            elif self.waiting and now - self.last_progress > self.timeout_s:
                self.failed = (f"no engine step for {now - self.last_progress:.0f} s with {self.waiting} request(s) "
                               f"waiting (engine.health_timeout_s={self.timeout_s:g})")
        return self.failed

    def died(self, reason: str, engine: Any) -> EngineDied:
        return EngineDied(f"engine died: {reason}", engine, self.generation)

    async def guard(self, work: Awaitable[Any], engine: Any = None) -> Any:
        """`await work`, checking the replica every `check_s`; raises `EngineDied` as soon as it
        counts as dead (the work is cancelled, not awaited: a hung engine core never answers)."""
        generation = self.generation
        reason = self.failure()
        if reason is not None:
            raise self.died(reason, engine)
        if self.waiting == 0:
            self.last_progress = self.clock()     # an idle engine makes no steps: count from now
        self.waiting += 1
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.check_s)
                if done:
                    try:
                        return task.result()
                    except Exception as e:
                        if self.generation != generation:
                            raise EngineDied("engine restarted under this request", engine, generation) from e
                        if _is_engine_dead_error(e) or self.errored():
                            self.failed = self.failed or f"vLLM raised {type(e).__name__}"
                            raise self.died(self.failed, engine) from e
                        raise
                if self.generation != generation:   # restarted while this request waited on the old core
                    task.cancel()
                    raise EngineDied("engine restarted under this request", engine, generation)
                reason = self.failure()
                if reason is not None:
                    task.cancel()
                    raise self.died(reason, engine)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self.waiting -= 1


class EngineSupervisor:
    """Restarts the dead replicas of one rollout host (module docstring). `current_weights()`:
    (named tensors or None, version) a restarted replica must hold, as the live ones do (called
    in a worker thread, holding `lock`); `why_not`: why this run cannot restart engines (one
    line), or None; `release`: gives the trainer's cached device memory back before a restarted
    engine starts (`weight_sync.colocated.release_trainer_cache`; restarts happen in a single
    process only, see `why_not`, so its barrier is none)."""

    def __init__(self, *, max_restarts: int, current_weights: Callable[[], tuple[Any, int]],
                 why_not: str | None = None, release: Callable[[], None] = release_trainer_cache):
        if max_restarts < 0:
            raise ValueError(f"engine.max_restarts={max_restarts}: must be >= 0")
        self.max_restarts, self.current_weights, self.why_not = max_restarts, current_weights, why_not
        self.release = release
        self.lock = threading.RLock()   # held by a restart, and by the trainer while the weights change
        self.restarts = 0
        self._restarting: dict[tuple[int, int], asyncio.Future] = {}

    async def recover(self, died: EngineDied) -> None:
        """Called by every trajectory `died` interrupted, on the rollout loop: the first starts
        the replica's restart, all wait for it. Raises `EngineRestartsExhausted` if it may not."""
        engine = died.engine
        if engine is None or engine.health.generation != died.generation:
            return                                  # already restarted since it was seen
        key = (id(engine), died.generation)
        task = self._restarting.get(key)
        if task is None:
            task = self._restarting[key] = asyncio.ensure_future(asyncio.to_thread(self._restart, engine, died))
            task.add_done_callback(lambda _t: self._restarting.pop(key, None) if engine.health.generation != key[1]
                                   else None)
        await asyncio.shield(task)

    def heal(self, engines: list[Any]) -> None:
        """Restart, in this thread and now, every replica that counts as dead (before a weight
        push, which a dead replica would fail); the trajectories it interrupted find it restarted."""
        for engine in engines:
            reason = engine.health.failure()
            if reason is not None:
                self._restart(engine, engine.health.died(reason, engine))

    def _restart(self, engine: Any, died: EngineDied) -> None:
        with self.lock:
            if engine.health.generation != died.generation:
                return
            if self.why_not is not None:
                raise EngineRestartsExhausted(f"{died.reason}; not restarted: {self.why_not}")
            if self.restarts >= self.max_restarts:
                raise EngineRestartsExhausted(f"{died.reason}; engine.max_restarts={self.max_restarts} "
                                              f"restart(s) already done in this run")
            self.restarts += 1
            log.warning("%s: restarting it (%d of engine.max_restarts=%d)", died.reason, self.restarts,
                        self.max_restarts)
            started = time.monotonic()
            try:
                weights, version = self.current_weights()
                self.release()   # the trainer's cached memory back to the driver before the engine starts
                engine.restart(weights, version)
            except Exception as e:
                first = (str(e).splitlines() or [""])[0]
                raise EngineRestartsExhausted(f"{died.reason}; its restart failed ({type(e).__name__}: {first})") from e
            engine.health.reset()   # only now: until the weights are in, new requests wait for this restart
            log.warning("engine restarted with weights version %d in %.1f s", engine.weights_version,
                        time.monotonic() - started)
