"""Multi-node mode: HTTP front ends enqueue calls in Redis; workers on any machine run them.
This module is what both sides share: the config and key names, the connection pool, the
reply message, process ids and how their loops wind down.

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

Redis going away (restarted, a network blip) is ridden out by redis-py itself: every connection
carries a `redis.asyncio.retry.Retry` with `redis.backoff.ExponentialBackoff` (`retry_policy`),
which reconnects and resends a command failing with a ConnectionError or TimeoutError (a Redis
still loading its data answers BusyLoadingError, a ConnectionError) after `min(backoff_cap,
backoff_base * 2**n)` seconds, `retries` times (the defaults: about 9 s of backoff). Only what
is about correctness stays in our loops: a command resent after its first try did run but lost its
answer (see the worker's sweep of its processing list), and what to do once the retries are spent.
A Redis restarted without persistence loses the queued calls (their callers get `queue_timeout`
at the bound of `RedisFrontend.run`); calls running on workers meanwhile are still answered.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sandbox.core.result import RunResult

REPLY_TTL_S = 3600
RETRIED_ERRORS = (RedisConnectionError, RedisTimeoutError)   # what `retry_policy` resends (redis-py's default)


@dataclass
class RedisConfig:
    url: str
    namespace: str = "rstar2:sandbox"
    lease: float = 10.0           # seconds without a heartbeat before a worker counts as dead
    max_attempts: int = 2         # runs of one call before a worker death becomes an error result
    queue_wait: float = 600.0     # seconds a call may wait in Redis before "queue_timeout"
    default_timeout: float = 10.0  # per-call timeout when a caller gives none
    max_connections: int = 8      # Redis connections per process (a blocking pool: commands wait for one)
    retries: int = 8              # redis-py resends of a command that lost its connection (`retry_policy`)
    backoff_base: float = 0.05    # seconds: the n-th resend waits min(backoff_cap, backoff_base * 2**n)
    backoff_cap: float = 2.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"RedisConfig.url: expected redis://host:port, got {self.url!r}")
        for name in ("lease", "max_attempts", "queue_wait", "default_timeout", "max_connections",
                     "backoff_base", "backoff_cap"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RedisConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.retries < 1:   # 0 would leave the loops that go on after a failure without any backoff
            raise ValueError(f"RedisConfig.retries must be >= 1, got {self.retries!r}")

    @property
    def queue(self) -> str:
        return f"{self.namespace}:queue"

    def processing(self, worker_id: str) -> str:
        return f"{self.namespace}:processing:{worker_id}"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self.namespace}:worker:{worker_id}"

    def reply(self, frontend_id: str) -> str:
        return f"{self.namespace}:reply:{frontend_id}"


def retry_policy(cfg: RedisConfig) -> Retry:
    """redis-py's retry of a command whose connection failed (module docstring); its default
    errors are ConnectionError and TimeoutError."""
    return Retry(ExponentialBackoff(cap=cfg.backoff_cap, base=cfg.backoff_base), cfg.retries,
                 supported_errors=RETRIED_ERRORS)


def connect(cfg: RedisConfig) -> aioredis.Redis:
    """A client whose pool holds at most `cfg.max_connections` connections and makes commands
    wait for a free one (redis-py's default pool raises MaxConnectionsError instead). The pool's
    connections carry `retry_policy(cfg)`: with a pool given, redis-py takes the retry from the
    pool's connections, not from `Redis(retry=...)`."""
    pool = aioredis.BlockingConnectionPool.from_url(cfg.url, max_connections=cfg.max_connections, timeout=None,
                                                    retry=retry_policy(cfg))
    return aioredis.Redis(connection_pool=pool)


def result_message(work_id: str, result: RunResult) -> str:
    """The reply a worker (or a reaper) pushes for one call."""
    return json.dumps({"id": work_id, "result": result.to_dict()})


def process_id() -> str:
    """Unique name of a front end or worker process across machines."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


async def wind_down(tasks: list[asyncio.Task], grace: float) -> None:
    """Let `tasks` end on their own within `grace` seconds, then cancel the rest."""
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=grace)
    for t in late:
        t.cancel()
    await asyncio.gather(*late, return_exceptions=True)
