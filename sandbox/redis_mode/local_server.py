"""A throwaway redis-server on this machine, for single-machine runs of Redis mode (tests,
`rstar2 bench-tools --client redis`): a free loopback port, no persistence, stopped after."""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server_process():
    """A throwaway redis-server on a free loopback port (no persistence); yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise ValueError("redis-server is not on PATH")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
