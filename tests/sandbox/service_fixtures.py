"""Shared helpers for the sandbox-service tests: a real uvicorn server in a thread, a real
redis-server on a free loopback port, and the embedded Sandbox they serve."""
from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time

import httpx
import pytest
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SharedPool:
    """The session's sandbox pool as a server backend that the app must not start or close."""

    def __init__(self, pool):
        self.pool = pool

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def __getattr__(self, name):
        return getattr(self.pool, name)


def make_sandbox(workers: int = 2, timeout: float = 5.0):
    from sandbox.core.pool import Sandbox
    from sandbox.core.limits import Limits

    # fast start (the service tests need no numpy/sympy); the pool on its own thread, as serve-sandbox runs it
    return Sandbox(workers=workers, limits=Limits(timeout=timeout, cpu_time=timeout), unsafe_no_isolation=True,
                   preload=("math",))


@contextlib.contextmanager
def serve_in_thread(app, port: int | None = None):
    """Run `app` on uvicorn in a background thread (its own event loop); yield its base URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def redis_server():
    """A throwaway redis-server on a free loopback port; yields its URL and stops it after."""
    from sandbox.redis_mode.local_server import redis_server_process

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    with redis_server_process() as url:
        yield url


def post_batch(url: str, submissions: list[dict], route: str = "/run/long-batch", **kw) -> httpx.Response:
    return httpx.post(f"{url}{route}", json={"type": "batch", "submissions": submissions}, timeout=60, **kw)
