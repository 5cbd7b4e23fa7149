"""Entry points behind `rstar2 serve-sandbox --redis URL [--worker]`: the HTTP front end on Redis,
and the supervised worker processes."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

from sandbox.redis_mode.frontend import RedisFrontend
from sandbox.redis_mode.wire import RedisConfig
from sandbox.redis_mode.worker import worker_argv
from sandbox.service.embedded import preflight
from sandbox.service.server import ServiceConfig, serve

log = logging.getLogger(__name__)


def serve_frontend(host: str, port: int, redis: RedisConfig, config: ServiceConfig, log_level: str = "warning") -> None:
    """Serve the code-judge API in front of Redis workers (blocking). The front end runs no code:
    each worker applies the isolation gate itself."""
    print(f"rstar2 sandbox service on http://{host}:{port} (redis {redis.url})", file=sys.stderr, flush=True)
    serve(RedisFrontend(redis), config, host=host, port=port, log_level=log_level, loop="auto")


def serve_workers(redis: RedisConfig, sandbox_kwargs: dict, concurrency: int, procs: int) -> None:
    """Run `procs` supervised Redis worker processes; each hosts one embedded Sandbox."""
    preflight(sandbox_kwargs)  # fail here, once, with a clear message if isolation is missing
    print(f"rstar2 sandbox workers: {procs} process(es) x {concurrency} calls on {redis.url}",
          file=sys.stderr, flush=True)
    supervise(worker_argv(redis, sandbox_kwargs, concurrency), procs)


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
