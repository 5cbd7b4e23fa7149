"""The Redis front end: a Sandbox-like backend for the HTTP service whose calls run on Redis
workers, and the reaper that requeues (or fails) the calls of workers that died. The queue's
design is described in sandbox.redis_mode.wire."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from sandbox.core.result import RunResult
from sandbox.redis_mode.wire import (REPLY_TTL_S, RETRIED_ERRORS, RedisConfig, connect, process_id, result_message,
                                     wind_down)
from sandbox.service.codejudge import QueueTimeout

log = logging.getLogger(__name__)

REPLIES_PER_READ = 512


def _last_part(key) -> str:
    """The id at the end of a Redis key such as `prefix:heartbeat:<id>` (bytes or str)."""
    return (key.decode() if isinstance(key, bytes) else key).rsplit(":", 1)[1]


async def reap_dead_workers(r: aioredis.Redis, cfg: RedisConfig) -> int:
    """Requeue or fail the calls held by workers whose heartbeat expired; returns calls handled."""
    handled = 0
    async for key in r.scan_iter(match=cfg.processing("*")):
        worker_id = _last_part(key)
        if await r.exists(cfg.heartbeat(worker_id)):
            continue
        claim = f"{cfg.namespace}:reaping:{worker_id}:{uuid.uuid4().hex}"
        try:
            await r.rename(key, claim)  # atomic: only one reaper wins this list
        except ResponseError:
            continue
        for raw in await r.lrange(claim, 0, -1):
            try:
                work = json.loads(raw)
            except ValueError:
                log.error("dropping unparseable work item from dead worker %s", worker_id)
                continue
            work["attempts"] = work.get("attempts", 0) + 1
            if work["attempts"] < cfg.max_attempts:
                await r.rpush(cfg.queue, json.dumps(work))  # the consuming end: runs next
            else:
                err = RunResult.internal_error(
                    f"sandbox worker {worker_id} died while running this call "
                    f"(tried {work['attempts']} time(s))")
                async with r.pipeline(transaction=True) as p:
                    p.lpush(work["reply_to"], result_message(work["id"], err))
                    p.expire(work["reply_to"], REPLY_TTL_S)
                    await p.execute()
            handled += 1
        await r.delete(claim)
    return handled


class RedisFrontend:
    """A Sandbox-like backend whose calls run on Redis workers (see `RedisWorker`)."""

    def __init__(self, cfg: RedisConfig):
        self.cfg = cfg
        self.frontend_id = process_id()
        self._r: aioredis.Redis | None = None
        self._pending: dict[str, asyncio.Future] = {}
        self._tasks: list[asyncio.Task] = []
        self._stats = {"workers": 0, "queued": 0, "completed": 0, "errors": 0, "reaped": 0, "pushes": 0}
        self._outbox: list[tuple[str, str]] = []  # (work id, message) not yet pushed
        self._pusher: asyncio.Task | None = None
        self._worker_protections: dict[str, dict] = {}
        self._closing = asyncio.Event()

    async def start(self) -> None:
        if self._r is not None:
            return
        self._r = connect(self.cfg)
        await self._r.ping()  # fail fast with a clear connection error
        self._closing.clear()
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._maintain())]

    async def __aenter__(self) -> RedisFrontend:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        # Stop the loops at their next poll instead of cancelling them mid-command: a redis-py
        # connection cancelled halfway through a reply can wedge the pool.
        self._closing.set()
        await wind_down(self._tasks, grace=5.0)
        self._tasks = []
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(RunResult.internal_error("sandbox front end shut down"))
        if self._r is not None:
            with contextlib.suppress(Exception):
                key = self.cfg.reply(self.frontend_id)
                await asyncio.wait_for(self._r.delete(key, f"{key}:taken"), 2)
            await self._r.aclose()
            self._r = None

    async def run(self, code: str, stdin: str | None = None, timeout: float | None = None,
                  session: str | None = None) -> RunResult:
        if session is not None:
            raise ValueError("persistent sessions are not supported in Redis mode; send the history instead")
        if self._r is None:
            raise RuntimeError("RedisFrontend.run called before start()")
        t = timeout or self.cfg.default_timeout
        work_id = uuid.uuid4().hex
        raw = json.dumps({"id": work_id, "code": code, "stdin": stdin, "timeout": timeout,
                          "reply_to": self.cfg.reply(self.frontend_id), "attempts": 0,
                          "deadline": time.time() + self.cfg.queue_wait})
        fut = asyncio.get_running_loop().create_future()
        self._pending[work_id] = fut
        self._outbox.append((work_id, raw))
        if self._pusher is None or self._pusher.done():
            self._pusher = asyncio.create_task(self._push())
        try:
            # bound: queue wait + every allowed run + time to notice dead workers
            limit = self.cfg.queue_wait + self.cfg.max_attempts * (t + 3 * self.cfg.lease) + 5.0
            try:
                return await asyncio.wait_for(asyncio.shield(fut), limit)
            except asyncio.TimeoutError:
                await self._r.lrem(self.cfg.queue, 1, raw)  # never run it after we answered
                raise QueueTimeout(f"no sandbox worker answered within {limit:.0f}s "
                                   f"({self._stats['workers']} worker(s) alive)") from None
        finally:
            self._pending.pop(work_id, None)

    async def _push(self) -> None:
        """Send every call queued so far in one LPUSH per round (one connection, however many calls)."""
        await asyncio.sleep(0)  # let the other calls of this round join
        while self._outbox:
            batch, self._outbox = self._outbox, []
            try:   # a lost connection is retried by redis-py (wire.retry_policy)
                await self._r.lpush(self.cfg.queue, *(raw for _, raw in batch))
                self._stats["pushes"] += 1
            except (OSError, aioredis.RedisError) as e:
                log.warning("enqueue of %d calls failed after redis-py's retries: %r", len(batch), e)
                for work_id, _ in batch:
                    fut = self._pending.get(work_id)
                    if fut is not None and not fut.done():
                        fut.set_exception(ConnectionError(f"could not enqueue the call in Redis {self.cfg.url}: {e!r}"))

    async def run_batch(self, items: list[dict], timeout: float | None = None) -> list[RunResult]:
        async def one(item: dict) -> RunResult:
            try:
                return await self.run(item["code"], item.get("stdin"), timeout, item.get("session"))
            except QueueTimeout as e:
                return RunResult.internal_error(str(e))
        return list(await asyncio.gather(*(one(i) for i in items)))

    def close_session(self, session: str) -> None:
        return None  # Redis mode has no sessions (run() rejects them)

    def stats(self) -> dict:
        return {**self._stats, "pending": len(self._pending)}

    def protections(self) -> dict:
        return {"backend": "redis", "workers": dict(self._worker_protections)}

    async def _listen(self) -> None:
        """Drain our reply list without ever losing a reply: replies are moved (atomically) to a
        `taken` list, delivered, and only then deleted. A read whose answer is lost on the way
        (a socket timeout on a starved machine drops the connection, and with it what a BLPOP
        had already removed) leaves them in `taken`, delivered next round; a reply delivered
        twice is dropped the second time."""
        key = self.cfg.reply(self.frontend_id)
        taken = f"{key}:taken"
        while not self._closing.is_set():
            try:
                messages = await self._r.lrange(taken, 0, -1)
                if not messages:
                    first = await self._r.blmove(key, taken, timeout=1, src="RIGHT", dest="LEFT")
                    if first is None:
                        continue
                    async with self._r.pipeline(transaction=False) as p:
                        for _ in range(REPLIES_PER_READ - 1):
                            p.lmove(key, taken, "RIGHT", "LEFT")
                        messages = [first] + [m for m in await p.execute() if m is not None]
                for message in messages:
                    self._deliver(message)
                await self._r.delete(taken)
            except RETRIED_ERRORS as e:
                # redis-py's retries are spent (wire.retry_policy; they did the backoff): the
                # listener lives as long as the front end, so it goes on with the next round
                log.warning("reply listener: %r after redis-py's retries; listening again", e)
            except (OSError, aioredis.RedisError) as e:   # one redis-py does not retry: no busy loop
                log.warning("reply listener: %r; listening again in 0.5 s", e)
                await asyncio.sleep(0.5)

    def _deliver(self, message: bytes) -> None:
        try:
            msg = json.loads(message)
            result = RunResult.from_dict(msg["result"])
        except (ValueError, KeyError, TypeError):
            log.error("unparseable result message: %r", message[:200])
            return
        fut = self._pending.get(msg["id"])
        if fut is not None and not fut.done():  # a late duplicate (a requeued call) is dropped
            fut.set_result(result)
            self._stats["completed"] += 1
            self._stats["errors"] += result.reason == "internal_error"

    async def _maintain(self) -> None:
        """Reap dead workers and refresh the numbers /status shows."""
        while not self._closing.is_set():
            try:
                self._stats["reaped"] += await reap_dead_workers(self._r, self.cfg)
                self._stats["queued"] = await self._r.llen(self.cfg.queue)
                prot = {}
                async for key in self._r.scan_iter(match=self.cfg.heartbeat("*")):
                    value = await self._r.get(key)
                    if value is not None:
                        prot[_last_part(key)] = json.loads(value)
                self._worker_protections = prot
                self._stats["workers"] = len(prot)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep maintaining through Redis hiccups
                log.warning("maintenance pass failed: %r", e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), min(1.0, self.cfg.lease / 3))
