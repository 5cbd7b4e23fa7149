"""Host-side handle of one zygote: starts it in its jail, multiplexes calls over its pipes.

Requests and answers are length-prefixed frames matched by id, so several calls share one
zygote. If the zygote dies (or stops answering), every call in flight gets an error instead of
hanging, and the pool starts a replacement.

Why a subprocess protocol and not asyncio streams: at a thousand calls a second the host's own
cost per call matters (it shares the cores with the calls). The protocol parses every answer that
arrived in one read, and the requests of one event-loop round go out in one write, which also
lets the zygote start them in one burst of forks.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time

from sandbox.jail.backends import JailPlan
from sandbox.inside.frames import ANSWER_KIND, READY, FrameBuffer, decode_host_frame, encode_request

STARTUP_TIMEOUT = 120.0
WATCHDOG_PERIOD = 1.0
_ids = itertools.count(1)


class WorkerDied(Exception):
    """The zygote exited or was killed while a call was in flight."""


class _ZygotePipes(asyncio.SubprocessProtocol):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.frames = FrameBuffer((READY, ANSWER_KIND))
        self.err = bytearray()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 2:
            self.err += data
            *lines, rest = self.err.split(b"\n")
            self.err = bytearray(rest[-4096:])
            self.worker.stderr_tail.extend(line.decode(errors="replace").rstrip() for line in lines)
            return
        try:
            frames = [(kind, decode_host_frame(kind, body)) for kind, body in self.frames.frames(data)]
        except ValueError as exc:
            self.worker.fail(f"sent a malformed frame ({exc})")
            return
        for kind, frame in frames:
            self.worker.on_frame(kind, frame)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.worker.fail("exited")

    def process_exited(self) -> None:
        self.worker.exited.set()
        self.worker.fail("exited")


class Worker:
    def __init__(self, index: int, plan: JailPlan, preload: tuple[str, ...], tier: str = "heavy") -> None:
        self.index, self.plan, self.preload, self.tier = index, plan, preload, tier
        self.transport: asyncio.SubprocessTransport | None = None
        self.pending: dict[int, tuple[asyncio.Future, float, float]] = {}  # id -> (future, deadline, watchdog)
        self.alive = False
        self.dead = asyncio.Event()
        self.exited = asyncio.Event()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=50)
        self._ready: asyncio.Future | None = None
        self._outgoing: list[bytes] = []
        self._watchdog: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        """Host pid of the process that holds this worker's jail (killing it kills the zygote)."""
        return self.transport.get_pid() if self.transport else None

    @property
    def inflight(self) -> int:
        return len(self.pending)

    async def start(self) -> None:
        argv, env = self.plan.command(self.index, self.preload, light=self.tier == "light")
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        pipe = asyncio.subprocess.PIPE
        self.transport, _ = await loop.subprocess_exec(
            lambda: _ZygotePipes(self), *argv, stdin=pipe, stdout=pipe, stderr=pipe, env=env,
            start_new_session=True)
        try:
            await asyncio.wait_for(self._ready, STARTUP_TIMEOUT)
        except (asyncio.TimeoutError, RuntimeError, ValueError) as exc:
            await self.kill()
            await asyncio.sleep(0)
            detail = " | ".join(self.stderr_tail) or str(exc) or type(exc).__name__
            raise RuntimeError(f"sandbox worker {self.index} failed to start: {detail}") from None
        self.alive = True
        self._watchdog = asyncio.create_task(self._watch())

    async def call(self, request: dict, watchdog: float) -> dict:
        """Send one request; the zygote enforces the limits, `watchdog` only catches a stuck zygote."""
        if not self.alive:
            raise WorkerDied(f"worker {self.index} is not running")
        call_id = next(_ids)
        future = asyncio.get_running_loop().create_future()
        self.pending[call_id] = (future, time.monotonic() + watchdog, watchdog)
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(encode_request({**request, "id": call_id}))
        try:
            return await future
        finally:
            self.pending.pop(call_id, None)

    def _flush(self) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        pipe = self.transport.get_pipe_transport(0) if self.alive else None
        if pipe is None or pipe.is_closing():
            self.fail("has no request pipe")
            return
        pipe.write(data)

    def on_frame(self, kind: int, frame: dict) -> None:
        if kind == READY:
            if not self._ready.done():
                self._ready.set_result(frame)
            return
        entry = self.pending.get(frame["id"])
        if entry is not None and not entry[0].done():
            entry[0].set_result(frame)

    async def _watch(self) -> None:
        """Kill the zygote if a call outlives its watchdog (its limits should have ended it)."""
        while self.alive:
            await asyncio.sleep(WATCHDOG_PERIOD)
            now = time.monotonic()
            late = next(((f, w) for f, deadline, w in self.pending.values() if deadline < now), None)
            if late is not None:
                late[0].set_exception(WorkerDied(
                    f"worker {self.index} did not answer within {late[1]:.0f} s; restarted"))
                await self.kill()

    def fail(self, reason: str) -> None:
        """The zygote is gone or unusable: fail its calls now (the pool replaces it)."""
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(RuntimeError(reason))
        if not self.alive:
            return
        self.alive = False
        tail = f": {self.stderr_tail[-1]}" if self.stderr_tail else ""
        for future, _, _ in self.pending.values():
            if not future.done():
                future.set_exception(WorkerDied(f"worker {self.index} {reason}{tail}"))
        if reason != "exited" and self.transport is not None:
            with contextlib.suppress(ProcessLookupError):
                self.transport.kill()
        self.dead.set()

    async def kill(self) -> None:
        if self.transport is not None and self.transport.get_returncode() is None:
            with contextlib.suppress(ProcessLookupError):
                self.transport.kill()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), 10)
        self.fail("was killed")

    async def stop(self) -> None:
        """Polite shutdown: closing stdin makes the zygote kill its calls and exit."""
        if self.transport is not None and self.transport.get_returncode() is None:
            pipe = self.transport.get_pipe_transport(0)
            if pipe is not None:
                pipe.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.exited.wait(), 3)
        await self.kill()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.transport is not None:
            self.transport.close()
