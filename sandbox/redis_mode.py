"""Multi-node mode: HTTP front ends enqueue calls in Redis; workers on any machine run them.

Why a lease-based reliable queue rather than plain LPUSH/BRPOP: a worker that dies mid-call
(OOM-killed, node preempted) must not lose the call silently. Each worker atomically moves a call
from the shared queue into its own processing list (BLMOVE) and keeps a heartbeat key alive
(TTL = lease). Any front end periodically reaps processing lists whose heartbeat expired: each
call found there is requeued once more (up to `max_attempts` runs) or answered with an
`internal_error` result saying the worker died. Results go to a per-front-end reply list that a
single listener drains, so thousands of waiting calls cost one Redis connection, not thousands.

Connections are bounded whatever the load: each process uses a blocking pool of
`max_connections` (a command waits for a free connection, never fails for want of one); a front
end sends the calls of one event-loop round in one LPUSH and drains replies many at a time, and
a worker moves up to its free capacity of calls per fetch and sends the answers of one round in
one transaction.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from sandbox.codejudge import QueueTimeout
from sandbox.result import RunResult

log = logging.getLogger(__name__)

REPLY_TTL_S = 3600


@dataclass
class RedisConfig:
    url: str
    namespace: str = "rstar2:sandbox"
    lease: float = 10.0           # seconds without a heartbeat before a worker counts as dead
    max_attempts: int = 2         # runs of one call before a worker death becomes an error result
    queue_wait: float = 600.0     # seconds a call may wait in Redis before "queue_timeout"
    default_timeout: float = 10.0  # per-call timeout when a caller gives none
    max_connections: int = 8      # Redis connections per process (a blocking pool: commands wait for one)

    def __post_init__(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"RedisConfig.url: expected redis://host:port, got {self.url!r}")
        for name in ("lease", "max_attempts", "queue_wait", "default_timeout", "max_connections"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RedisConfig.{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def queue(self) -> str:
        return f"{self.namespace}:queue"

    def processing(self, worker_id: str) -> str:
        return f"{self.namespace}:processing:{worker_id}"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self.namespace}:worker:{worker_id}"

    def reply(self, frontend_id: str) -> str:
        return f"{self.namespace}:reply:{frontend_id}"


def connect(cfg: RedisConfig) -> aioredis.Redis:
    """A client whose pool holds at most `cfg.max_connections` connections and makes commands
    wait for a free one (redis-py's default pool raises MaxConnectionsError instead)."""
    pool = aioredis.BlockingConnectionPool.from_url(cfg.url, max_connections=cfg.max_connections, timeout=None)
    return aioredis.Redis(connection_pool=pool)


REPLIES_PER_READ = 512


def _result_message(work_id: str, result: RunResult) -> str:
    return json.dumps({"id": work_id, "result": result.to_dict()})


def _process_id() -> str:
    """Unique name of a front end or worker process across machines."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


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
                    p.lpush(work["reply_to"], _result_message(work["id"], err))
                    p.expire(work["reply_to"], REPLY_TTL_S)
                    await p.execute()
            handled += 1
        await r.delete(claim)
    return handled


class RedisFrontend:
    """A Sandbox-like backend whose calls run on Redis workers (see `RedisWorker`)."""

    def __init__(self, cfg: RedisConfig):
        self.cfg = cfg
        self.frontend_id = _process_id()
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
        await _finish(self._tasks, grace=5.0)
        self._tasks = []
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(RunResult.internal_error("sandbox front end shut down"))
        if self._r is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._r.delete(self.cfg.reply(self.frontend_id)), 2)
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
            for attempt in range(5):
                try:
                    await self._r.lpush(self.cfg.queue, *(raw for _, raw in batch))
                    self._stats["pushes"] += 1
                    break
                except (ConnectionError, OSError, aioredis.RedisError) as e:
                    log.warning("enqueue of %d calls failed: %r; retrying", len(batch), e)
                    await asyncio.sleep(0.2 * 2 ** attempt)
            else:
                for work_id, _ in batch:
                    fut = self._pending.get(work_id)
                    if fut is not None and not fut.done():
                        fut.set_exception(ConnectionError(f"could not enqueue the call in Redis {self.cfg.url}"))

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
        key = self.cfg.reply(self.frontend_id)
        while not self._closing.is_set():
            try:
                item = await self._r.blpop([key], timeout=1)
            except (ConnectionError, OSError, aioredis.RedisError) as e:
                log.warning("reply listener: %r; retrying", e)
                await asyncio.sleep(0.5)
                continue
            if item is None:
                continue
            messages = [item[1]]
            try:
                messages += await self._r.lpop(key, REPLIES_PER_READ) or []
            except (ConnectionError, OSError, aioredis.RedisError) as e:
                log.warning("reply listener: %r; the rest are read next round", e)
            for message in messages:
                self._deliver(message)

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


class RedisWorker:
    """Pulls calls from Redis and runs them on an embedded Sandbox, `concurrency` at a time."""

    def __init__(self, cfg: RedisConfig, sandbox, concurrency: int):
        if concurrency <= 0:
            raise ValueError(f"RedisWorker concurrency must be > 0, got {concurrency!r}")
        self.cfg, self.sandbox, self.concurrency = cfg, sandbox, concurrency
        self.worker_id = _process_id()
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
            await _finish(fetchers, grace=(limits.timeout if limits else 10.0) + 5.0)
            done.set()
            await _finish([beat], grace=self.cfg.lease)
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
        for (one blocking move, then the rest in one pipeline), and run each as its own task."""
        processing = self.cfg.processing(self.worker_id)
        running: set[asyncio.Task] = set()
        self._answers: list[tuple[str, str, bytes]] = []  # (reply list, message, raw work item)
        self._answering: asyncio.Task | None = None
        try:
            while not stop.is_set():
                if len(running) >= self.concurrency:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    first = await r.blmove(self.cfg.queue, processing, timeout=1, src="RIGHT", dest="LEFT")
                    items = [first] if first is not None else []
                    room = self.concurrency - len(running) - 1
                    if first is not None and room > 0:
                        async with r.pipeline(transaction=False) as p:
                            for _ in range(room):
                                p.lmove(self.cfg.queue, processing, "RIGHT", "LEFT")
                            items += [raw for raw in await p.execute() if raw is not None]
                except aioredis.RedisError as e:
                    log.warning("fetch failed: %r", e)
                    await asyncio.sleep(0.5)
                    continue
                for raw in items:
                    task = asyncio.create_task(self._run_one(r, processing, raw))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            if running:  # calls in flight finish (the caller bounds this with a grace period)
                await asyncio.gather(*running, return_exceptions=True)
            if self._answering is not None:
                await self._answering

    async def _run_one(self, r: aioredis.Redis, processing: str, raw: bytes) -> None:
        try:
            work = json.loads(raw)
            work_id, reply_to, deadline = work["id"], work["reply_to"], float(work["deadline"])
        except (ValueError, KeyError, TypeError) as e:  # nobody to answer: log and drop
            log.error("dropping malformed work item %r: %r", raw[:200], e)
            await r.lrem(processing, 1, raw)
            return
        if time.time() > deadline:  # its front end has already given up
            await r.lrem(processing, 1, raw)
            return
        try:
            result = await self.sandbox.run(work.get("code"), stdin=work.get("stdin"), timeout=work.get("timeout"))
        except Exception as e:  # misuse errors (bad fields) still get an answer
            result = RunResult.internal_error(f"worker {self.worker_id} could not run this call: {e}")
        self._answers.append((reply_to, _result_message(work_id, result), raw))
        if self._answering is None or self._answering.done():
            self._answering = asyncio.create_task(self._answer(r, processing))

    async def _answer(self, r: aioredis.Redis, processing: str) -> None:
        """Send the answers of this round in one transaction: each reply is pushed and its work
        item leaves our processing list together, so a call is never both answered and requeued."""
        await asyncio.sleep(0)
        while self._answers:
            batch, self._answers = self._answers, []
            while True:
                try:
                    async with r.pipeline(transaction=True) as p:
                        for reply_to, message, raw in batch:
                            p.lpush(reply_to, message)
                            p.expire(reply_to, REPLY_TTL_S)
                            p.lrem(processing, 1, raw)
                        await p.execute()
                    break
                except aioredis.RedisError as e:  # the items stay ours: retried, or requeued if we die
                    log.warning("sending %d answers failed: %r; retrying", len(batch), e)
                    await asyncio.sleep(0.5)


async def _finish(tasks: list[asyncio.Task], grace: float) -> None:
    """Let `tasks` end on their own within `grace` seconds, then cancel the rest."""
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=grace)
    for t in late:
        t.cancel()
    await asyncio.gather(*late, return_exceptions=True)


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
    """The command line of one worker process (see `main`), for `supervise`."""
    spec = {"redis": asdict(cfg), "sandbox": sandbox_kwargs, "concurrency": concurrency}
    return [sys.executable, "-m", "sandbox.redis_mode", json.dumps(spec)]


def main(argv: list[str] | None = None) -> None:
    """`python -m sandbox.redis_mode SPEC_JSON`: one worker process hosting one Sandbox."""
    from sandbox.launch import sandbox_from_kwargs

    spec = json.loads((argv or sys.argv[1:])[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_worker(RedisConfig(**spec["redis"]), sandbox_from_kwargs(spec["sandbox"]), int(spec["concurrency"]))


def _raise_interrupt(*_) -> None:
    raise KeyboardInterrupt


def supervise(argv: list[str], procs: int, poll: float = 1.0) -> None:
    """Keep `procs` worker processes (`argv`) alive, replacing any that die, until interrupted."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    children: list[subprocess.Popen] = [subprocess.Popen(argv) for _ in range(procs)]
    try:
        while True:
            time.sleep(poll)
            for i, child in enumerate(children):
                if child.poll() is not None:
                    log.warning("sandbox worker pid %s exited with %s; starting a replacement", child.pid, child.returncode)
                    print(f"sandbox worker pid {child.pid} exited ({child.returncode}); replaced", file=sys.stderr)
                    children[i] = subprocess.Popen(argv)
    except KeyboardInterrupt:
        pass
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    main()
