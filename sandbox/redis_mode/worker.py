"""Redis worker hosts: pull calls from the shared queue and run them on an embedded Sandbox.

The queue's design (leases, heartbeats, requeue on a dead worker) is described in
sandbox.redis_mode.wire; this module is the worker's side of it.
`python -m sandbox.redis_mode.worker SPEC_JSON` runs one worker process.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from dataclasses import asdict

import redis.asyncio as aioredis

from sandbox.core.result import RunResult
from sandbox.redis_mode.wire import (REPLY_TTL_S, RETRIED_ERRORS, RedisConfig, connect, process_id, result_message,
                                     wind_down)
from sandbox.service.embedded import sandbox_from_kwargs

log = logging.getLogger(__name__)


class RedisWorker:
    """Pulls calls from Redis and runs them on an embedded Sandbox, `concurrency` at a time."""

    def __init__(self, cfg: RedisConfig, sandbox, concurrency: int):
        if concurrency <= 0:
            raise ValueError(f"RedisWorker concurrency must be > 0, got {concurrency!r}")
        self.cfg, self.sandbox, self.concurrency = cfg, sandbox, concurrency
        self.worker_id = process_id()
        self._protections = "{}"

    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        r = connect(self.cfg)
        await r.ping()
        await self.sandbox.start()
        self._protections = json.dumps(await asyncio.to_thread(self.sandbox.protections))
        await self._beat(r)
        done = asyncio.Event()  # the heartbeat outlives the fetch loops' last calls
        beat = asyncio.create_task(self._heartbeat(r, done))
        fetchers = [asyncio.create_task(self._fetch_loop(r, stop))]
        log.info("sandbox worker %s serving %s", self.worker_id, self.cfg.url)
        try:
            await stop.wait()
        finally:
            # calls in flight finish (within their timeout); whatever is still held after the
            # grace is handed back: the heartbeat goes and a front end's reaper requeues it
            limits = getattr(self.sandbox, "limits", None)
            await wind_down(fetchers, grace=(limits.timeout if limits else 10.0) + 5.0)
            done.set()
            await wind_down([beat], grace=self.cfg.lease)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(r.delete(self.cfg.heartbeat(self.worker_id)), 2)
            await self.sandbox.close()
            await r.aclose()

    async def _beat(self, r: aioredis.Redis) -> None:
        # the heartbeat value tells front ends (GET /protections) how this worker is confined
        await r.set(self.cfg.heartbeat(self.worker_id), self._protections, px=int(self.cfg.lease * 1000))

    async def _heartbeat(self, r: aioredis.Redis, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._beat(r)
            except aioredis.RedisError as e:
                log.warning("heartbeat failed: %r", e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.lease / 3)

    async def _fetch_loop(self, r: aioredis.Redis, stop: asyncio.Event) -> None:
        """Move calls from the queue into our processing list, as many per round as we have room
        for (one blocking move, then the rest in one pipeline), and run each as its own task.
        Every `lease` seconds, and after a fetch that failed, our processing list is swept for
        calls we moved without hearing so (`_orphans`)."""
        processing = self.cfg.processing(self.worker_id)
        running: set[asyncio.Task] = set()
        self._held: set[bytes] = set()       # work items in our processing list, not yet answered or dropped
        self._answered: set[bytes] = set()   # work items answered while a sweep reads the list
        self._sweeping = False
        self._answers: list[tuple[str, str, bytes]] = []  # (reply list, message, raw work item)
        self._answering: asyncio.Task | None = None
        next_sweep = time.monotonic() + self.cfg.lease
        try:
            while not stop.is_set():
                if len(running) >= self.concurrency:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                items: list[bytes] = []
                try:
                    if time.monotonic() >= next_sweep:
                        next_sweep = time.monotonic() + self.cfg.lease
                        items = await self._orphans(r, processing)
                    first = await r.blmove(self.cfg.queue, processing, timeout=1, src="RIGHT", dest="LEFT")
                    items += [first] if first is not None else []
                    room = self.concurrency - len(running) - len(items)
                    if first is not None and room > 0:
                        async with r.pipeline(transaction=False) as p:
                            for _ in range(room):
                                p.lmove(self.cfg.queue, processing, "RIGHT", "LEFT")
                            items += [raw for raw in await p.execute() if raw is not None]
                except aioredis.RedisError as e:   # redis-py's retries are spent (wire.retry_policy)
                    log.warning("fetch failed: %r; sweeping our processing list next round", e)
                    next_sweep = 0.0
                    if not isinstance(e, RETRIED_ERRORS):   # redis-py did no backoff: no busy loop
                        await asyncio.sleep(0.5)
                for raw in items:
                    self._held.add(raw)
                    task = asyncio.create_task(self._run_one(r, processing, raw))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            if running:  # calls in flight finish (the caller bounds this with a grace period)
                await asyncio.gather(*running, return_exceptions=True)
            if self._answering is not None:
                await self._answering

    async def _orphans(self, r: aioredis.Redis, processing: str) -> list[bytes]:
        """Calls in our processing list that this process does not hold. redis-py resends a move
        whose connection failed (wire.retry_policy), and the first send may have moved a call
        before its answer was lost; such a call sits in our processing list, where no reaper
        looks while our heartbeat lives, so we pick it up here. A call answered while the list
        is read is left alone (`_answered`): its answer went out, so it must not run again."""
        self._answered, self._sweeping = set(), True
        try:
            listed = await r.lrange(processing, 0, -1)
        finally:
            self._sweeping = False
        return [raw for raw in listed if raw not in self._held and raw not in self._answered]

    async def _drop(self, r: aioredis.Redis, processing: str, raw: bytes) -> None:
        """Take a call nobody waits for off our processing list (a failed LREM leaves it to a sweep)."""
        try:
            await r.lrem(processing, 1, raw)
        finally:
            self._held.discard(raw)

    async def _run_one(self, r: aioredis.Redis, processing: str, raw: bytes) -> None:
        try:
            work = json.loads(raw)
            work_id, reply_to, deadline = work["id"], work["reply_to"], float(work["deadline"])
        except (ValueError, KeyError, TypeError) as e:  # nobody to answer: log and drop
            log.error("dropping malformed work item %r: %r", raw[:200], e)
            await self._drop(r, processing, raw)
            return
        if time.time() > deadline:  # its front end has already given up
            await self._drop(r, processing, raw)
            return
        try:
            result = await self.sandbox.run(work.get("code"), stdin=work.get("stdin"), timeout=work.get("timeout"))
        except Exception as e:  # misuse errors (bad fields) still get an answer
            result = RunResult.internal_error(f"worker {self.worker_id} could not run this call: {e}")
        self._answers.append((reply_to, result_message(work_id, result), raw))
        if self._answering is None or self._answering.done():
            self._answering = asyncio.create_task(self._answer(r, processing))

    async def _answer(self, r: aioredis.Redis, processing: str) -> None:
        """Send the answers of this round in one transaction: each reply is pushed and its work
        item leaves our processing list together, so a call is never both answered and requeued.
        A lost connection is retried by redis-py; answers it could not send stay ours (their calls
        stay in our processing list, requeued by a reaper if we die) and go out with the next
        round. A transaction resent after it ran pushes a reply twice: the front end drops the
        second."""
        await asyncio.sleep(0)
        while self._answers:
            batch, self._answers = self._answers, []
            try:
                async with r.pipeline(transaction=True) as p:
                    for reply_to, message, raw in batch:
                        p.lpush(reply_to, message)
                        p.expire(reply_to, REPLY_TTL_S)
                        p.lrem(processing, 1, raw)
                    await p.execute()
            except aioredis.RedisError as e:
                log.warning("sending %d answers failed: %r; they go out with the next round", len(batch), e)
                self._answers = batch + self._answers
                if not isinstance(e, RETRIED_ERRORS):   # redis-py did no backoff: no busy loop
                    await asyncio.sleep(0.5)
                continue
            for _, _, raw in batch:
                self._held.discard(raw)
                if self._sweeping:
                    self._answered.add(raw)


def run_worker(cfg: RedisConfig, sandbox, concurrency: int) -> None:
    """Blocking worker entry point; SIGTERM/SIGINT stop it cleanly."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await RedisWorker(cfg, sandbox, concurrency).run_forever(stop)

    asyncio.run(main())


def worker_argv(cfg: RedisConfig, sandbox_kwargs: dict, concurrency: int) -> list[str]:
    """The command line of one worker process (see `main`), for `sandbox.redis_mode.launch.supervise`."""
    spec = {"redis": asdict(cfg), "sandbox": sandbox_kwargs, "concurrency": concurrency}
    return [sys.executable, "-m", "sandbox.redis_mode.worker", json.dumps(spec)]


def main(argv: list[str] | None = None) -> None:
    """`python -m sandbox.redis_mode.worker SPEC_JSON`: one worker process hosting one Sandbox."""
    spec = json.loads((argv or sys.argv[1:])[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = RedisConfig(**spec["redis"])
    try:
        run_worker(cfg, sandbox_from_kwargs(spec["sandbox"]), int(spec["concurrency"]))
    except RETRIED_ERRORS as e:   # Redis gone past redis-py's retries: one line; the supervisor decides
        print(f"sandbox worker: Redis {cfg.url} does not answer ({e}); exiting", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
