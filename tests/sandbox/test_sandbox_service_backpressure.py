"""The bounded queue: /run answers 429 when full, long-batch waits for room, and every call gets a
result (run, queue_timeout or internal_error) -- nothing is dropped. A backend whose calls block
until the test releases them makes "the queue is full" a state, not a race."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from sandbox.service.codejudge import QueueTimeout
from sandbox.core.result import RunResult
from sandbox.service.server import ServiceConfig, create_app


class HeldBackend:
    """Test double: each call echoes its code once `release` is set."""

    def __init__(self, error: Exception | None = None):
        self.release = asyncio.Event()
        self.started = 0
        self.error = error

    async def start(self): ...
    async def close(self): ...
    def close_session(self, session): ...
    def protections(self): return {"backend": "test"}
    def stats(self): return {"workers": 1, "queued": 0}

    async def run(self, code, stdin=None, timeout=None, session=None):
        self.started += 1
        if self.error is not None:
            raise self.error
        await self.release.wait()
        return RunResult(stdout=code, stderr="", exit_code=0, wall_time=0.0, reason="ok")


def client_for(backend, **cfg) -> httpx.AsyncClient:
    app = create_app(backend, ServiceConfig(**cfg))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30)
    client.service = app.state.service
    return client


def subs(*codes: str) -> dict:
    return {"type": "batch", "submissions": [{"type": "python", "solution": c} for c in codes]}


async def until(predicate) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never became true")


async def test_full_queue_answers_429_and_loses_nothing():
    backend = HeldBackend()
    async with client_for(backend, max_queue=2) as client:
        held = asyncio.create_task(client.post("/run/batch", json=subs("a", "b")))
        await until(lambda: backend.started == 2)
        rejected = await client.post("/run", json={"type": "python", "solution": "c"})
        assert rejected.status_code == 429 and "queue is full" in rejected.json()["detail"]
        assert rejected.headers["retry-after"] == "1"
        too_big = await client.post("/run/batch", json=subs("x", "y", "z"))
        assert too_big.status_code == 413 and "long-batch" in too_big.json()["detail"]
        backend.release.set()
        done = (await held).json()["results"]
        assert [r["stdout"] for r in done] == ["a", "b"]
        counters = (await client.get("/status")).json()["counters"]
        assert counters["rejected"] == 4 and counters["completed"] == 2


async def test_long_batch_waits_for_room_and_keeps_order():
    backend = HeldBackend()
    async with client_for(backend, max_queue=2) as client:
        batch = asyncio.create_task(client.post("/run/long-batch", json=subs(*"abcde")))
        await until(lambda: backend.started == 2)
        status = (await client.get("/status")).json()
        assert status["in_flight"] == 2 and status["queue"] == 3
        backend.release.set()
        resp = await batch
        assert resp.status_code == 200
        assert [r["stdout"] for r in resp.json()["results"]] == list("abcde")
        assert backend.started == 5


async def test_long_batch_reports_queue_timeout_when_room_never_comes():
    backend = HeldBackend()
    async with client_for(backend, max_queue=1, long_batch_wait=0.2) as client:
        batch = asyncio.create_task(client.post("/run/long-batch", json=subs("a", "b", "c")))
        gate = client.service.gate
        await until(lambda: backend.started == 1 and gate.waiting == 2)
        await until(lambda: gate.waiting == 0)  # past long_batch_wait: b and c gave up
        backend.release.set()
        results = (await batch).json()["results"]
        assert [r["reason"] for r in results] == ["", "queue_timeout", "queue_timeout"]
        assert results[0]["stdout"] == "a" and not results[1]["run_success"]


@pytest.mark.parametrize("error, reason", [(RuntimeError("backend broke"), "internal_error"),
                                           (QueueTimeout("no worker answered"), "queue_timeout")])
async def test_backend_faults_become_results_not_500(error, reason):
    async with client_for(HeldBackend(error=error), max_queue=4) as client:
        resp = await client.post("/run", json={"type": "python", "solution": "print(1)"})
        assert resp.status_code == 200
        assert resp.json()["reason"] == reason and not resp.json()["success"]
        assert str(error) in resp.json()["stderr"]
