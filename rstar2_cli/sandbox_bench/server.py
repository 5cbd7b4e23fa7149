"""`rstar2 serve-sandbox` in a subprocess, for the benchmarks that measure the sandbox over HTTP."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import httpx


@contextlib.contextmanager
def server_process(sandbox_kwargs: dict, port: int, redis_url: str | None = None):
    """`rstar2 serve-sandbox` in a subprocess on 127.0.0.1:port; yields its URL once it answers."""
    boot = ("import json, sys\n"
            "from sandbox.service.server import ServiceConfig\n"
            "a, config = json.loads(sys.argv[1]), ServiceConfig(max_queue=4096)\n"
            "if a['redis']:\n"
            "    from sandbox.redis_mode.launch import serve_frontend\n"
            "    from sandbox.redis_mode.wire import RedisConfig\n"
            "    serve_frontend('127.0.0.1', a['port'], RedisConfig(a['redis']), config)\n"
            "else:\n"
            "    from sandbox.service.launch import serve_http\n"
            "    serve_http('127.0.0.1', a['port'], a['kwargs'], config)\n")
    spec = json.dumps({"port": port, "kwargs": sandbox_kwargs, "redis": redis_url})
    proc = subprocess.Popen([sys.executable, "-c", boot, spec], start_new_session=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox server exited with {proc.returncode} before answering")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/ping", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("sandbox server did not answer /ping within 180 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
