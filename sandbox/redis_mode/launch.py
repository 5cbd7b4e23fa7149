"""Entry points behind `rstar2 serve-sandbox --redis URL [--worker]`: the HTTP front end on Redis,
and the supervised worker processes."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from redis import Redis, RedisError
from redis.connection import parse_url

from sandbox.redis_mode.frontend import RedisFrontend
from sandbox.redis_mode.wire import RedisConfig
from sandbox.redis_mode.worker import worker_argv
from sandbox.service.embedded import preflight
from sandbox.service.server import ServiceConfig, serve

log = logging.getLogger(__name__)


# How long a start waits for Redis to answer (`serve-sandbox --redis-wait`): the SLURM template starts
# the front end and workers once Redis answers its PING; by hand they may start a little before it.
REDIS_WAIT_S = 30.0
# Workers that keep dying while Redis does not answer for this long: the supervisor gives up (exit 1).
WORKERS_REDIS_DOWN_S = 120.0


def wait_for_redis(url: str, wait_s: float, poll_s: float = 1.0) -> str | None:
    """PING `url` until it answers or `wait_s` seconds pass; None if it answered, else why not (one line)."""
    deadline = time.monotonic() + wait_s
    while True:
        client = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
            return None
        except (RedisError, OSError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0]
        finally:
            client.close()
        if time.monotonic() + poll_s > deadline:
            return why
        time.sleep(poll_s)


def require_redis(url: str, wait_s: float) -> None:
    """A ValueError (the command's one-line error) unless Redis at `url` answers within `wait_s`."""
    why = wait_for_redis(url, wait_s)
    if why is not None:
        raise ValueError(f"--redis {url}: no Redis answered within {wait_s:g} s ({why}); start it first, "
                         f"e.g. redis-server --port {parse_url(url).get('port', 6379)}")


def serve_frontend(host: str, port: int, redis: RedisConfig, config: ServiceConfig, log_level: str = "warning",
                   redis_wait_s: float = REDIS_WAIT_S) -> None:
    """Serve the code-judge API in front of Redis workers (blocking). The front end runs no code:
    each worker applies the isolation gate itself. Refuses to start (ValueError) when Redis does not
    answer within `redis_wait_s`."""
    require_redis(redis.url, redis_wait_s)
    print(f"rstar2 sandbox service on http://{host}:{port} (redis {redis.url})", file=sys.stderr, flush=True)
    serve(RedisFrontend(redis), config, host=host, port=port, log_level=log_level, loop="auto")


def serve_workers(redis: RedisConfig, sandbox_kwargs: dict, concurrency: int, procs: int,
                  redis_wait_s: float = REDIS_WAIT_S) -> None:
    """Run `procs` supervised Redis worker processes; each hosts one embedded Sandbox. Refuses to start
    (ValueError) when Redis does not answer within `redis_wait_s`, and gives up (exit 1) once workers
    keep dying with Redis gone for WORKERS_REDIS_DOWN_S."""
    preflight(sandbox_kwargs)  # fail here, once, with a clear message if isolation is missing
    require_redis(redis.url, redis_wait_s)
    print(f"rstar2 sandbox workers: {procs} process(es) x {concurrency} calls on {redis.url}",
          file=sys.stderr, flush=True)
    supervise(worker_argv(redis, sandbox_kwargs, concurrency), procs,
              queue_down=lambda: wait_for_redis(redis.url, 0.0))


def _raise_interrupt(*_) -> None:
    raise KeyboardInterrupt


def supervise(argv: list[str], procs: int, poll: float = 1.0, queue_down: Callable[[], str | None] | None = None,
              give_up_s: float = WORKERS_REDIS_DOWN_S) -> None:
    """Keep `procs` worker processes (`argv`) alive, replacing any that die, until interrupted.
    `queue_down` (None: the queue answers; else why not) is asked when one dies: dying while the queue
    has not answered for `give_up_s` ends the supervisor with one line and exit status 1."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    children: list[subprocess.Popen] = [subprocess.Popen(argv) for _ in range(procs)]
    down_since: float | None = None
    try:
        while True:
            time.sleep(poll)
            for i, child in enumerate(children):
                if child.poll() is not None:
                    why = queue_down() if queue_down is not None else None
                    if why is None:
                        down_since = None
                    else:
                        down_since = down_since or time.monotonic()
                        if time.monotonic() - down_since >= give_up_s:
                            print(f"error: sandbox workers: Redis has not answered for {give_up_s:g} s ({why}); "
                                  f"stopping", file=sys.stderr, flush=True)
                            raise SystemExit(1)
                    log.warning(
                        "sandbox worker pid %s exited with %s; starting a replacement", child.pid, child.returncode
                    )
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
