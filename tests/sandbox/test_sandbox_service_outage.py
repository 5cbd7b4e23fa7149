"""A remote sandbox that goes away: `RemoteSandbox` retries refused connections and a server killed
mid-request with backoff (tenacity), answers once the server is back on its port, and past its
retries gives `internal_error` results and counts the outage (`RemoteSandbox.outage`)."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time

import httpx
import pytest
from service_fixtures import SharedPool, free_port, serve_in_thread

from sandbox.service.client import RemoteSandbox, SandboxOutage
from sandbox.service.server import ServiceConfig, create_app


async def test_a_server_down_then_back_within_the_retries_answers(sandbox_pool):
    port = free_port()
    async with RemoteSandbox(f"http://127.0.0.1:{port}", timeout=30, retries=10, backoff=0.1,
                             max_backoff=0.5) as sb:
        call = asyncio.create_task(sb.run("print(6*7)"))
        await asyncio.sleep(0.5)                       # connection refused meanwhile, and retried
        assert not call.done()
        with serve_in_thread(create_app(SharedPool(sandbox_pool), ServiceConfig()), port=port):
            res = await asyncio.wait_for(call, 30)
            assert res.ok and res.stdout == "42\n"
        # the same port again: down (the client's kept-alive connection is dead), then back
        call = asyncio.create_task(sb.run("print(7*6)"))
        await asyncio.sleep(0.5)
        assert not call.done()
        with serve_in_thread(create_app(SharedPool(sandbox_pool), ServiceConfig()), port=port):
            res = await asyncio.wait_for(call, 30)
    assert res.ok and res.stdout == "42\n"
    assert sb.outage.down_for() == 0.0 and sb.outage.failures == 0   # retried through: no failed request


async def test_past_the_retries_calls_are_internal_errors_and_the_outage_is_counted(sandbox_pool):
    port = free_port()
    async with RemoteSandbox(f"http://127.0.0.1:{port}", timeout=30, retries=2, backoff=0.05) as sb:
        first = await sb.run("print(1)")
        await asyncio.sleep(0.2)
        both = await sb.run_batch([{"code": "print(2)"}, {"code": "print(3)"}])
        assert first.reason == "internal_error" and "failed after 3 tries" in first.stderr
        assert [r.reason for r in both] == ["internal_error"] * 2
        assert sb.outage.failures == 2 and sb.outage.down_for() >= 0.2
        with serve_in_thread(create_app(SharedPool(sandbox_pool), ServiceConfig()), port=port):
            back = await sb.run("print(4)")
    assert back.ok and back.stdout == "4\n"
    assert sb.outage.down_for() == 0.0 and sb.outage.failures == 0


def test_the_outage_is_the_span_seen_failing():
    """From the start of the first failed request to the end of the latest; time with no request
    (a trainer in its update) adds nothing; any answered request ends it."""
    outage = SandboxOutage()
    outage.failed(10.0, 13.5)
    outage.failed(40.0, 43.5)
    assert outage.down_for() == 33.5 and outage.failures == 2
    outage.succeeded()
    assert outage.down_for() == 0.0
    outage.failed(100.0, 103.5)
    assert outage.down_for() == 3.5


def _serve_sandbox(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from rstar2_cli.cli import app; app()", "serve-sandbox", "--port", str(port),
           "--workers", "1", "--isolation", "none", "--unsafe-no-isolation"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/ping").status_code == 200:
                return
        assert proc.poll() is None and time.monotonic() < deadline, "serve-sandbox did not come up"
        time.sleep(0.1)


@pytest.mark.slow
async def test_serve_sandbox_killed_mid_call_and_restarted_on_its_port():
    """What benchmarks/compare/chaos_rl.py does to an RL run: SIGKILL `rstar2 serve-sandbox` while a call
    runs, start it again on the same port; the call is resent and answered."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = [_serve_sandbox(port)]
    try:
        await asyncio.to_thread(_wait_up, url, procs[0])
        async with RemoteSandbox(url, timeout=60, retries=10, backoff=0.25, max_backoff=2.0) as sb:
            assert (await sb.run("print(1)")).ok
            call = asyncio.create_task(sb.run("import time\ntime.sleep(1.0)\nprint('slept')"))
            await asyncio.sleep(0.5)                   # in flight on the server
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            procs.append(_serve_sandbox(port))
            res = await asyncio.wait_for(call, 90)
            assert res.ok and res.stdout == "slept\n"
            assert sb.outage.failures == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
