"""The embedded sandbox: a warm pool of jailed, preloaded zygotes behind an async API.

`Sandbox` owns a private event loop on a daemon thread; the zygotes' pipes live there. Callers
await `run()` from any event loop (or call `run_sync()` from plain code), which keeps one pool
usable across the trainer's loops, pytest's per-test loops and scripts alike. Every outcome of
user code is a RunResult; only misuse (bad arguments, isolation unavailable) raises.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time

from sandbox.core.handoff import Bridge
from sandbox.core.limits import Limits
from sandbox.core.preludes import KnownPreludes, PreludeDigest
from sandbox.core.result import RunResult
from sandbox.core.sessions import SessionFull, SessionStore
from sandbox.core.tiers import fits_light, split_preload
from sandbox.core.worker import Worker, WorkerDied
from sandbox.inside.frames import REROUTE
from sandbox.jail.backends import JailPlan, plan
from sandbox.jail.probe import probe_protections

# The stdlib modules executor templates import (the rStar release's client wraps every call in one
# that imports these): preloaded, a wrapped call skips ~1,000 page faults (~16 ms of CPU) of
# imports, while a plain call pays ~4 more faults per fork (see docs/sandbox.md).
WRAPPER_STDLIB = ("ast", "base64", "traceback", "typing", "linecache", "types", "contextlib", "io")
DEFAULT_PRELOAD = ("math", "fractions", "itertools", *WRAPPER_STDLIB, "numpy", "sympy")
# Calls sent to a zygote beyond its slots wait in its queue: it starts them the moment a slot
# frees (no host round trip) and in bursts, which is cheaper per call (see Zygote._start_waiting).
QUEUE_PER_SLOT = 2
_RESTART_ATTEMPTS = 3


class Sandbox:
    """A pool of `workers` zygotes with the full preload, plus as many stdlib-only "light" ones
    for calls that cannot need the heavy modules (see sandbox.core.tiers). Each zygote runs up to
    `slots_per_worker` calls at once (default 8 as root, where each slot has its own uid; 1
    otherwise), each in a fresh forked child.

    The pool's pipes live on an event loop of its own, on a daemon thread, so that callers on
    any loop (or none) can share it. `own_thread=False` puts them on the loop that starts the
    pool instead, for a service whose calls all come from that loop (`serve-sandbox`): no thread
    hand-off per call, and no two threads taking turns at the GIL. Callers on other loops then
    still work (through the same hand-off), but not `run_sync` from the pool's own loop.

    `preludes`: the executor-template preludes (texts, or `PreludeDigest`s) whose calls take the
    template fast path (see sandbox.core.preludes); more can be added with `register_prelude`."""

    def __init__(self, workers: int | None = None, limits: Limits | None = None, isolation: str = "auto",
                 preload: tuple[str, ...] = DEFAULT_PRELOAD, unsafe_no_isolation: bool = False,
                 slots_per_worker: int | None = None, own_thread: bool = True,
                 preludes: tuple[str | PreludeDigest, ...] = ()) -> None:
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers: must be a positive integer, got {workers!r}")
        if slots_per_worker is not None and (not isinstance(slots_per_worker, int) or slots_per_worker < 1):
            raise ValueError(f"slots_per_worker: must be a positive integer, got {slots_per_worker!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise ValueError(f"limits: expected a sandbox.Limits, got {type(limits).__name__}")
        self.limits = limits or Limits()
        self.n_workers = workers or max(1, os.cpu_count() or 1)
        self.isolation, self.preload = isolation, tuple(preload)
        self.unsafe_no_isolation = unsafe_no_isolation
        self.preludes = KnownPreludes(preludes)
        self._slots_hint = slots_per_worker
        self.own_thread = own_thread
        self._plan: JailPlan | None = None
        self._workers: list[Worker] = []
        self._sessions = SessionStore()
        self._protections: dict = {}
        self._counts = {"completed": 0, "errors": 0, "restarts": 0, "busy": 0, "queued": 0, "rerouted": 0,
                        "fast_template": 0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bridge: Bridge | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._started: concurrent.futures.Future | None = None
        self._light_preload, self._heavy = split_preload(self.preload)
        self._free: dict[str, asyncio.Semaphore] = {}
        self._changed: asyncio.Condition | None = None
        self._supervisors: list[asyncio.Task] = []
        self._pickers = 0  # calls waiting in _pick

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.wrap_future(self._ensure_started())

    def _ensure_started(self) -> concurrent.futures.Future:
        with self._start_lock:
            if self._started is None:
                if not self.own_thread:
                    try:
                        self._loop = asyncio.get_running_loop()
                    except RuntimeError:
                        raise RuntimeError("Sandbox(own_thread=False) must be started from a running event "
                                           "loop (await sandbox.start())") from None
                self._plan = plan(self.isolation, self.unsafe_no_isolation, self.n_workers, self._slots_hint,
                                  self.preload)
                if self.own_thread:
                    self._loop = asyncio.new_event_loop()
                    self._thread = threading.Thread(target=self._loop.run_forever, name="sandbox-pool", daemon=True)
                    self._thread.start()
                self._bridge = Bridge(self._loop)
                self._started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
            return self._started

    async def _start(self) -> None:
        self._changed = asyncio.Condition()
        tiers = [("heavy", self.preload)] + ([("light", self._light_preload)] if self._heavy else [])
        for t, (tier, preload) in enumerate(tiers):
            self._free[tier] = asyncio.Semaphore(self.n_workers * self._depth)
            self._workers += [Worker(t * self.n_workers + i, self._plan, preload, tier) for i in range(self.n_workers)]
        try:
            await asyncio.gather(*(w.start() for w in self._workers))
        except BaseException:
            await self._stop()
            raise
        self._supervisors = [asyncio.create_task(self._supervise(w)) for w in self._workers]
        self._protections = await probe_protections(lambda code: self._run(code, None, 10.0, None),
                                                    self._plan.backend, self._plan.paths)

    @property
    def _depth(self) -> int:
        """Calls in flight per zygote: its slots plus its queue."""
        return self._plan.slots * QUEUE_PER_SLOT

    async def close(self) -> None:
        if self._started is None:
            return
        loop, thread = self._loop, self._thread
        try:
            if self._on_pool_loop():
                await self._stop()
            else:
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._stop(), loop))
        finally:
            if thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)
                loop.close()
            self._plan.cleanup()
            self._started = None
            self._thread = None

    def _on_pool_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _stop(self) -> None:
        for task in self._supervisors:
            task.cancel()
        workers, self._workers = self._workers, []
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- calls --------------------------------------------------------------------------
    async def run(self, code: str, stdin: str | None = None, timeout: float | None = None,
                  session: str | None = None) -> RunResult:
        self._check_call(code, stdin, session)
        if self._started is None or not self._started.done():
            await self.start()
        self._started.result()  # raises if the pool failed to start
        if self._thread is None and self._on_pool_loop():
            return await self._run(code, stdin, timeout, session)
        return await self._bridge.call(self._run, code, stdin, timeout, session)

    async def run_batch(self, items: list[dict], timeout: float | None = None) -> list[RunResult]:
        for i, item in enumerate(items):
            if not isinstance(item, dict) or "code" not in item:
                raise ValueError(f"run_batch items[{i}]: expected a dict with a 'code' key, got {item!r:.80}")
        return list(await asyncio.gather(*(self.run(item["code"], item.get("stdin"), timeout, item.get("session"))
                                           for item in items)))

    def run_sync(self, code: str, stdin: str | None = None, timeout: float | None = None,
                 session: str | None = None) -> RunResult:
        self._check_call(code, stdin, session)
        if self._on_pool_loop():
            raise RuntimeError("Sandbox.run_sync called from the pool's own event loop; await run() there")
        self._ensure_started().result()
        return asyncio.run_coroutine_threadsafe(self._run(code, stdin, timeout, session), self._loop).result()

    def close_session(self, session: str) -> None:
        self._sessions.close(session)

    def register_prelude(self, prelude: str | PreludeDigest) -> PreludeDigest:
        """Recognise calls that start with `prelude` (a text, or a `PreludeDigest`) from now on;
        any thread, before or after the pool starts."""
        return self.preludes.add(prelude)

    @staticmethod
    def _check_call(code, stdin, session) -> None:
        if not isinstance(code, str):
            raise ValueError(f"code: expected str, got {type(code).__name__}")
        if stdin is not None and not isinstance(stdin, str):
            raise ValueError(f"stdin: expected str or None, got {type(stdin).__name__}")
        if session is not None and not isinstance(session, str):
            raise ValueError(f"session: expected str or None, got {type(session).__name__}")

    async def _run(self, code: str, stdin: str | None, timeout: float | None, session: str | None) -> RunResult:
        limits = self.limits.for_call(timeout)
        if session is None:
            return await self._dispatch(code, stdin, limits, None)
        async with self._sessions.lock(session):
            try:
                history = self._sessions.history(session)
            except SessionFull as exc:
                return RunResult(stdout="", stderr=str(exc), exit_code=None, wall_time=0.0, reason="runtime_error")
            result = await self._dispatch(code, stdin, limits, history)
            if result.ok:
                self._sessions.record(session, code, stdin)
            return result

    async def _dispatch(self, code: str, stdin: str | None, limits: dict, history: list | None) -> RunResult:
        started = time.monotonic()
        text = code if not history else "\n".join([c for c, _ in history] + [code])
        template = None if history else self.preludes.recognise(code)  # see sandbox.inside.template_run
        if template is not None:
            self._counts["fast_template"] += 1
            text = code[template[1]:]  # a known prelude imports only the standard library
        tier = "light" if self._heavy and fits_light(text, self._heavy) else "heavy"
        request = {"code": code, "stdin": stdin, "history": history, "limits": limits, "template": template}
        frame = await self._on_tier(tier, request, started)
        if frame.get("reason") == REROUTE:  # it imported a module only the full tier has: run it there
            self._counts["rerouted"] += 1
            frame = await self._on_tier("heavy", request, started)
        if frame.get("reason") == REROUTE:  # only light zygotes answer this; a heavy one never should
            frame = RunResult.internal_error("a full-tier zygote asked to re-route a call").to_dict()
        result = RunResult.from_dict(frame)
        self._counts["completed"] += 1
        if result.reason == "internal_error":
            self._counts["errors"] += 1
        return result

    async def _on_tier(self, tier: str, request: dict, started: float) -> dict:
        """Run `request` on the least-loaded zygote of `tier`; the answer frame (or an error's)."""
        self._counts["queued"] += 1
        async with self._free[tier]:
            self._counts["queued"] -= 1
            self._counts["busy"] += 1
            try:
                worker = await self._pick(tier)
                if worker is None:
                    return RunResult.internal_error("no sandbox worker is running").to_dict()
                try:
                    return await worker.call(request, watchdog=request["limits"]["timeout"] * 1.5 + 30.0)
                finally:
                    if self._pickers:  # someone waits for a free slot on a live worker
                        async with self._changed:
                            self._changed.notify_all()
            except WorkerDied as exc:
                return RunResult.internal_error(str(exc), time.monotonic() - started).to_dict()
            finally:
                self._counts["busy"] -= 1

    async def _pick(self, tier: str) -> Worker | None:
        """The live worker of `tier` with the fewest calls in flight; waits while workers restart."""
        async with self._changed:
            while True:
                mine = [w for w in self._workers if w.tier == tier]
                live = [w for w in mine if w.alive and w.inflight < self._depth]
                if live:
                    return min(live, key=lambda w: w.inflight)
                if not mine:
                    return None
                self._pickers += 1
                try:
                    await self._changed.wait()
                finally:
                    self._pickers -= 1

    async def _supervise(self, worker: Worker) -> None:
        """Replace `worker` whenever it dies."""
        while True:
            await worker.dead.wait()
            if worker not in self._workers:
                return
            await worker.kill()
            for attempt in range(_RESTART_ATTEMPTS):
                fresh = Worker(worker.index, self._plan, worker.preload, worker.tier)
                try:
                    await fresh.start()
                    break
                except RuntimeError:
                    await asyncio.sleep(0.5 * (attempt + 1))
            else:
                async with self._changed:
                    self._workers.remove(worker)
                    self._changed.notify_all()
                return
            self._counts["restarts"] += 1
            async with self._changed:
                if worker not in self._workers:  # closed meanwhile
                    await fresh.stop()
                    return
                self._workers[self._workers.index(worker)] = fresh
                self._changed.notify_all()
            worker = fresh

    # ---- reporting ----------------------------------------------------------------------
    def protections(self) -> dict:
        """Protections measured by a probe snippet when the pool started (starts it if needed)."""
        if self._on_pool_loop() and not self._ensure_started().done():  # .result() would block that loop
            raise RuntimeError("Sandbox.protections() on the pool's own loop before it started; await start() first")
        self._ensure_started().result()
        return dict(self._protections)

    def stats(self) -> dict:
        """Counters for operators; `workers` counts live zygotes of both tiers."""
        return {"workers": sum(w.alive for w in self._workers),
                "light_workers": sum(w.alive for w in self._workers if w.tier == "light"),
                "slots_per_worker": self._plan.slots if self._plan else 0,
                "backend": self._plan.backend if self._plan else None,
                "sessions": len(self._sessions), **self._counts}

    def worker_pids(self) -> list[int]:
        """Host pids of the processes holding each worker's jail (for operators and tests)."""
        return [w.pid for w in self._workers if w.alive and w.pid]
