"""Symbolic grading in worker processes, with a hard timeout on every item.

sympy hangs on hostile answers (`9^{9^{9^{9}}}`, `10^{10^{10}}!`) and a hung grade would stall a
whole RL step, so math-verify never runs in the trainer process. Workers are started through the
forkserver (preloaded with math_verify/sympy, so a replacement is ready in milliseconds and the
trainer's threads/CUDA state are never forked). Each worker receives a chunk of items, to
amortise IPC, and reports every item as it finishes; the parent times each item from the moment
the previous one was reported. On an item's deadline the worker is SIGKILLed and replaced, that
item gets "timeout" and the rest of its chunk is re-dispatched. A worker that dies gives its
in-flight item "grader_crash" and is replaced the same way. Workers cap their address space
(`memory_limit_mb`) so a runaway big-integer computation fails inside the worker, not the host.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from rstar2_cli.reward.verify import job_verdict, prepare_worker

_PRELOAD = ["rstar2_cli.reward.verify", "math_verify", "sympy"]
_MAX_STARTUP_FAILURES = 3
_CLOSE_GRACE_S = 1.0


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _worker_main(conn: Connection, memory_limit_mb: int | None) -> None:
    """Grade chunks of (job_id, pred, gold) until told to stop; report each item as it finishes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    if memory_limit_mb:
        import resource

        limit = memory_limit_mb * 1024 * 1024
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ValueError, OSError):
            pass  # a lower hard limit is already in place

    prepare_worker()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for job_id, *job in chunk:
            conn.send((job_id, job_verdict(*job)))


@dataclass(eq=False)
class _Worker:
    process: BaseProcess
    conn: Connection
    started_at: float
    ready: bool = False
    chunk: deque[int] = field(default_factory=deque)  # job ids in flight; head is being graded
    item_started: float = 0.0


class WorkerPool:
    """A fixed number of grading processes; `run` grades (pred, gold) jobs with a per-item timeout."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        chunk_size: int = 16,
        start_method: str = "forkserver",
        memory_limit_mb: int | None = 4096,
        startup_timeout: float = 120.0,
    ) -> None:
        self.size = default_workers() if workers is None else workers
        if self.size < 1:
            raise ValueError(f"workers: must be >= 1, got {workers!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size: must be >= 1, got {chunk_size!r}")
        if start_method not in ("forkserver", "fork", "spawn"):
            raise ValueError(f"start_method: {start_method!r} is not one of forkserver, fork, spawn")
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout: must be > 0, got {startup_timeout!r}")
        self.chunk_size = chunk_size
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout = startup_timeout
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(_PRELOAD)  # no effect if the forkserver already runs
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._owner_pid = os.getpid()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main, args=(child_conn, self.memory_limit_mb), daemon=True, name="rstar2-grader"
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn, time.monotonic())

    def _discard(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=_CLOSE_GRACE_S)
        worker.conn.close()

    def _replace(self, worker: _Worker) -> None:
        self._discard(worker)
        self._workers[self._workers.index(worker)] = self._spawn()

    def start(self) -> None:
        """Start the workers now (otherwise the first `run` does)."""
        if self._closed:
            raise RuntimeError("WorkerPool is closed")
        if os.getpid() != self._owner_pid:  # we are a fork of the owner: its workers are not ours
            self._workers, self._owner_pid = [], os.getpid()
        while len(self._workers) < self.size:
            self._workers.append(self._spawn())

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the workers that are up (for monitoring and tests)."""
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    @property
    def busy_pids(self) -> list[int]:
        """Pids of the workers grading something right now."""
        return [w.process.pid for w in self._workers if w.chunk and w.process.pid is not None]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if os.getpid() != self._owner_pid:
                return
            for w in self._workers:
                try:
                    w.conn.send(None)
                except (OSError, ValueError):
                    pass
            end = time.monotonic() + _CLOSE_GRACE_S
            for w in self._workers:
                w.process.join(timeout=max(0.0, end - time.monotonic()))
                self._discard(w)
            self._workers = []

    def __enter__(self) -> "WorkerPool":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- grading ---------------------------------------------------------------------------
    def run(self, jobs: Sequence[tuple[str, ...]], timeout: float) -> list[str]:
        """Reason for each (pred, gold) or (pred, gold, kind) job (see `verify.job_verdict`), in order:
        correct/wrong/parse_error/grader_error/timeout/grader_crash. No item takes longer than `timeout`
        seconds of grading."""
        if not timeout > 0:
            raise ValueError(f"timeout: must be > 0 seconds, got {timeout!r}")
        if not jobs:
            return []
        with self._lock:
            self.start()
            try:
                return self._run(jobs, timeout)
            except BaseException:
                for w in list(self._workers):  # e.g. Ctrl-C: don't leave stale items in flight
                    if w.chunk:
                        self._replace(w)
                raise

    def _run(self, jobs: Sequence[tuple[str, ...]], timeout: float) -> list[str]:
        results: list[str | None] = [None] * len(jobs)
        pending = deque(range(len(jobs)))
        remaining = len(jobs)
        startup_failures = 0

        def settle(job_id: int, reason: str) -> None:
            nonlocal remaining
            results[job_id] = reason
            remaining -= 1

        def abandon(worker: _Worker, reason: str) -> None:
            if worker.chunk:
                settle(worker.chunk.popleft(), reason)
                pending.extendleft(reversed(worker.chunk))
            self._replace(worker)

        while remaining:
            now = time.monotonic()
            for w in list(self._workers):
                if w.ready and not w.chunk and pending:
                    take = max(1, min(self.chunk_size, math.ceil(len(pending) / self.size)))
                    ids = [pending.popleft() for _ in range(min(take, len(pending)))]
                    w.chunk.extend(ids)
                    w.item_started = now
                    try:
                        w.conn.send([(i, *jobs[i]) for i in ids])
                    except (OSError, ValueError):
                        pending.extendleft(reversed(w.chunk))
                        w.chunk.clear()
                        self._replace(w)
            deadlines = [w.item_started + timeout for w in self._workers if w.chunk]
            deadlines += [w.started_at + self.startup_timeout for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 1.0
            wait([w.conn for w in self._workers] + [w.process.sentinel for w in self._workers], wait_s)

            now = time.monotonic()
            for w in list(self._workers):
                dead = not w.process.is_alive()  # checked before draining: its last reports are in the pipe
                exitcode = w.process.exitcode
                try:
                    while w.conn.poll():
                        message = w.conn.recv()
                        if message[0] == "ready":
                            w.ready, startup_failures = True, 0
                        elif w.chunk and message[0] == w.chunk[0]:
                            settle(w.chunk.popleft(), message[1])
                            w.item_started = now
                except (EOFError, OSError):
                    dead = True
                if dead:
                    if not w.ready:
                        startup_failures += 1
                    abandon(w, "grader_crash")
                elif w.chunk and now - w.item_started >= timeout:
                    abandon(w, "timeout")
                elif not w.ready and now - w.started_at >= self.startup_timeout:
                    startup_failures += 1
                    self._replace(w)
                if startup_failures >= _MAX_STARTUP_FAILURES:
                    raise RuntimeError(
                        f"grader workers failed to start {startup_failures} times in a row "
                        f"(last exit code {exitcode}); check that math-verify imports in a fresh process"
                    )
        return [r for r in results if r is not None]
