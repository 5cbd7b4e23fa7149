"""The server driven by a client written to the rStar release's wire format: every call wrapped
in the executor template, posted to /run/long-batch, queue_timeout answers resent."""
from __future__ import annotations

import json

import httpx
import pytest
from service_fixtures import SharedPool, serve_in_thread

from sandbox.service.codejudge_client import call_long_batch, submission, tool_response
from sandbox.service.server import ServiceConfig, create_app


async def _post(url: str, subs: list[dict], library: str = "httpx") -> list[dict]:
    if library == "aiohttp":  # the release's own client library, with its force_close connector
        import aiohttp
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32, force_close=True))
        async with session:
            return await call_long_batch(session, f"{url}/run/long-batch", subs, backoff=0.2)
    async with httpx.AsyncClient(timeout=120) as client:
        return await call_long_batch(client, f"{url}/run/long-batch", subs, backoff=0.2)


@pytest.mark.parametrize("library", ["httpx", "aiohttp"])
async def test_release_client_gets_right_answers(sandbox_pool, library):
    if library == "aiohttp":
        pytest.importorskip("aiohttp")
    subs = [submission("print(6*7)"),
            submission("a, b = map(int, input().split())\nprint(a + b)", stdin="3 4"),
            submission("x = 5\nprint('x is', x)\nx * 2"),  # the template echoes even after a print
            submission("x = 1\ny = x / 0\nprint(y)"),
            submission("while True:\n    pass"),
            submission("import sympy\nsympy.factorint(2**61-1)"),
            submission("import numpy as np\nint(np.arange(10).sum())"),
            submission("print(y)", history=["y = 11", "raise ValueError('ignored in replay')"])]
    with serve_in_thread(create_app(SharedPool(sandbox_pool), ServiceConfig(timeout=1.0))) as url:
        before = httpx.get(f"{url}/status").json()["backend"]["fast_template"]
        results = await _post(url, subs, library)
        status = httpx.get(f"{url}/status").json()
    out = [(r["run_success"], r["reason"], r["stdout"]) for r in results]
    assert out[0] == (True, "", "42\n")
    assert out[1] == (True, "", "7\n")
    assert out[2] == (True, "", "x is 5\n10\n")
    assert (
        out[3][:2] == (False, "")
        and results[3]["stderr"] == "ZeroDivisionError at line 2: division by zero\n  y = x / 0\n"
    )
    assert out[4][:2] == (False, "worker_timeout")
    assert out[5] == (True, "", "{2305843009213693951: 1}\n")
    assert out[6] == (True, "", "45\n")
    assert out[7] == (True, "", "11\n")
    assert tool_response(results[0]).startswith("Tool call success\nstdout: 42\n")
    assert tool_response(results[4]).startswith("Tool call failure\nreason: worker_timeout")
    assert status["counters"]["internal_error"] == 0
    # every call (history cells included) went through the template fast path (sandbox.inside.template_run)
    assert status["backend"]["fast_template"] - before == len(subs)


async def test_release_client_resends_queue_timeouts(sandbox_pool):
    subs = [submission(f"import time\ntime.sleep(0.4)\nprint({i})") for i in range(6)]
    config = ServiceConfig(max_queue=2, long_batch_wait=0.15)  # room for 2: the rest time out in the queue
    with serve_in_thread(create_app(SharedPool(sandbox_pool), config)) as url:
        results = await _post(url, subs)
        status = httpx.get(f"{url}/status").json()
    assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(6)]
    assert status["counters"]["queue_timeout"] >= 4  # the client got them back and resent them


def _sleeps(monkeypatch, handler, **kw) -> tuple[list[dict | None], list[float]]:
    """call_long_batch against httpx's MockTransport, recording the seconds it sleeps."""
    import asyncio

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds, *args):
        slept.append(seconds)
        await real_sleep(0)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            monkeypatch.setattr(asyncio, "sleep", sleep)
            try:
                return await call_long_batch(client, "http://judge/run/long-batch", [submission("print(1)")] * 2,
                                             max_retries=4, backoff=0.5, **kw)
            finally:
                monkeypatch.setattr(asyncio, "sleep", real_sleep)

    return asyncio.run(go()), slept


def _answer(reason: str) -> dict:
    return {"sub_id": "", "success": not reason, "run_success": not reason, "cost": 0.0, "stdout": "1\n",
            "stderr": "", "reason": reason}


def test_release_client_sleeps_after_failed_attempts_as_the_release(monkeypatch):
    """backoff * 2**(attempt-1) after each failed attempt (the last included), none after a
    successful one unless sleep_after_every_attempt; only queue_timeout answers are resent."""
    sent: list[int] = []

    def one_queue_timeout(request):
        n = len(json.loads(request.content)["submissions"])
        sent.append(n)
        first = len(sent) == 1
        return httpx.Response(200, json={"results": [_answer("queue_timeout" if first and i == 0 else "")
                                                     for i in range(n)]})

    results, slept = _sleeps(monkeypatch, one_queue_timeout)
    assert sent == [2, 1] and slept == [0.5] and all(r["stdout"] == "1\n" for r in results)
    sent.clear()
    results, slept = _sleeps(monkeypatch, one_queue_timeout, sleep_after_every_attempt=True)
    assert sent == [2, 1] and slept == [0.5, 1.0]

    def refused(request):
        raise httpx.ConnectError("connection refused", request=request)

    results, slept = _sleeps(monkeypatch, refused)
    assert results == [None, None] and slept == [0.5, 1.0, 2.0, 4.0]
