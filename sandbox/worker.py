"""Host-side handle of one zygote: starts it in its jail, multiplexes calls over its pipes.

Requests and answers are length-prefixed JSON frames matched by id, so several calls share one
zygote. If the zygote dies (or stops answering), every call in flight gets an error instead of
hanging, and the pool starts a replacement.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools

from sandbox.jail import JailPlan
from sandbox.protocol import encode_request, read_frame

STARTUP_TIMEOUT = 120.0
_ids = itertools.count(1)


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


class WorkerDied(Exception):
    """The zygote exited or was killed while a call was in flight."""


class Worker:
    def __init__(self, index: int, plan: JailPlan, preload: tuple[str, ...], tier: str = "heavy") -> None:
        self.index, self.plan, self.preload, self.tier = index, plan, preload, tier
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.alive = False
        self.dead = asyncio.Event()
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=50)
        self._tasks: list[asyncio.Task] = []

    @property
    def pid(self) -> int | None:
        """Host pid of the process that holds this worker's jail (killing it kills the zygote)."""
        return self.proc.pid if self.proc else None

    @property
    def inflight(self) -> int:
        return len(self.pending)

    async def start(self) -> None:
        argv, env = self.plan.command(self.index, self.preload)
        self.proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        self._tasks.append(asyncio.create_task(self._drain_stderr()))
        try:
            ready = await asyncio.wait_for(read_frame(self.proc.stdout), STARTUP_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            await self.kill()
            await asyncio.sleep(0)
            detail = " | ".join(self.stderr_tail) or type(exc).__name__
            raise RuntimeError(f"sandbox worker {self.index} failed to start: {detail}") from None
        if not ready.get("ready"):
            await self.kill()
            raise RuntimeError(f"sandbox worker {self.index} sent {ready!r} instead of ready")
        self.alive = True
        self._tasks.append(asyncio.create_task(self._read_answers()))

    async def call(self, request: dict, watchdog: float) -> dict:
        """Send one request; the zygote enforces the limits, `watchdog` only catches a stuck zygote."""
        if not self.alive:
            raise WorkerDied(f"worker {self.index} is not running")
        call_id = next(_ids)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending[call_id] = future
        # A plain timer, not asyncio.wait_for: that wraps every call in an extra task (~15 % of
        # the host's cost per trivial call).
        timer = loop.call_later(watchdog, _expire, future)
        try:
            self.proc.stdin.write(encode_request({**request, "id": call_id}))
            if self.proc.stdin.transport.get_write_buffer_size():
                await self.proc.stdin.drain()
            return await future
        except asyncio.TimeoutError:
            await self.kill()
            raise WorkerDied(f"worker {self.index} did not answer within {watchdog:.0f} s; restarted") from None
        except (ConnectionError, RuntimeError) as exc:
            raise WorkerDied(f"worker {self.index} pipe failed: {exc}") from None
        finally:
            timer.cancel()
            self.pending.pop(call_id, None)

    async def _read_answers(self) -> None:
        reason = "exited"
        try:
            while True:
                frame = await read_frame(self.proc.stdout)
                future = self.pending.get(frame.get("id"))
                if future is not None and not future.done():
                    future.set_result(frame)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            reason = f"exited ({type(exc).__name__})"
        finally:
            self._mark_dead(reason)

    def _mark_dead(self, reason: str) -> None:
        if not self.alive:
            return
        self.alive = False
        tail = f": {self.stderr_tail[-1]}" if self.stderr_tail else ""
        for future in self.pending.values():
            if not future.done():
                future.set_exception(WorkerDied(f"worker {self.index} {reason}{tail}"))
        self.dead.set()

    async def _drain_stderr(self) -> None:
        with contextlib.suppress(Exception):
            async for line in self.proc.stderr:
                self.stderr_tail.append(line.decode(errors="replace").rstrip())

    async def kill(self) -> None:
        if self.proc and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), 10)
        self._mark_dead("was killed")

    async def stop(self) -> None:
        """Polite shutdown: closing stdin makes the zygote kill its calls and exit."""
        if self.proc and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 3)
        self.alive = False
        await self.kill()
        for task in self._tasks:
            task.cancel()
