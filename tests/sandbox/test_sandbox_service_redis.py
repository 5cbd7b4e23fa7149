"""Multi-node mode against a real redis-server: the HTTP front end queues calls, worker processes
run them, and a worker killed mid-call never loses the call (requeued, or an error result)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from service_fixtures import post_batch, redis_server, serve_in_thread

from sandbox.redis_mode.frontend import RedisFrontend
from sandbox.redis_mode.wire import RedisConfig
from sandbox.redis_mode.worker import worker_argv
from sandbox.service.server import ServiceConfig, create_app

pytestmark = pytest.mark.redis

SANDBOX = {"workers": 1, "unsafe_no_isolation": True, "preload": ["math"],
           "limits": {"timeout": 10.0, "cpu_time": 10.0}}
SLOW = "import time\ntime.sleep(2.5)\nprint('done')"


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


class Workers:
    """Worker processes, each in its own process group so a kill takes its whole pool down,
    like a machine dying."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, cfg: RedisConfig, concurrency: int = 2) -> subprocess.Popen:
        proc = subprocess.Popen(worker_argv(cfg, SANDBOX, concurrency), start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def kill(self, pid: int) -> None:
        os.killpg(pid, signal.SIGKILL)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def workers():
    w = Workers()
    yield w
    w.stop_all()


def wait_for(predicate, what: str, limit: float = 60.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def live_workers(r: redis.Redis, cfg: RedisConfig) -> list[str]:
    return [k.decode().rsplit(":", 1)[1] for k in r.scan_iter(match=cfg.heartbeat("*"))]


def holder_pid(r: redis.Redis, cfg: RedisConfig) -> int | None:
    """pid of the worker process whose processing list holds a call (worker ids embed the pid)."""
    for key in r.scan_iter(match=cfg.processing("*")):
        if r.llen(key):
            return int(key.decode().rsplit(":", 1)[1].split("-")[-2])
    return None


def test_http_front_end_runs_calls_on_redis_workers(redis_url, workers):
    cfg = RedisConfig(redis_url, namespace="t-http", lease=2.0)
    workers.start(cfg)
    wait_for(lambda: live_workers(redis.Redis.from_url(redis_url), cfg), "a worker heartbeat")
    with serve_in_thread(create_app(RedisFrontend(cfg), ServiceConfig(max_queue=8))) as url:
        subs = [{"type": "python", "solution": "print(int(input()) ** 2)", "input": str(i)} for i in range(5)]
        subs.append({"type": "python", "solution": "1/0"})
        results = post_batch(url, subs).json()["results"]
        assert [r["stdout"] for r in results[:5]] == [f"{i * i}\n" for i in range(5)]
        assert not results[5]["run_success"] and "ZeroDivisionError" in results[5]["stderr"]
        status = wait_for(lambda: (s := httpx.get(f"{url}/status").json())["num_workers"] == 1 and s,
                          "/status to count the worker")
        assert status["backend"]["completed"] >= 6 and status["queue"] == 0
        prot = httpx.get(f"{url}/protections").json()
        assert prot["backend"] == "redis" and len(prot["workers"]) == 1
        assert all(p["backend"] in ("nsjail", "bwrap", "namespaces", "none") for p in prot["workers"].values())


async def _run_and_kill(cfg: RedisConfig, workers: Workers, r: redis.Redis):
    """Start SLOW on whichever worker takes it, kill that worker's process group mid-call."""
    async with RedisFrontend(cfg) as front:
        call = asyncio.create_task(front.run(SLOW))
        pid = await asyncio.to_thread(wait_for, lambda: holder_pid(r, cfg), "a worker to take the call")
        workers.kill(pid)
        result = await asyncio.wait_for(call, 60)
        return result, pid, front.stats()


async def test_killed_worker_call_is_requeued_to_a_live_worker(redis_url, workers):
    cfg = RedisConfig(redis_url, namespace="t-requeue", lease=2.0, max_attempts=2)
    r = redis.Redis.from_url(redis_url)
    procs = [workers.start(cfg), workers.start(cfg)]
    await asyncio.to_thread(wait_for, lambda: len(live_workers(r, cfg)) == 2, "two worker heartbeats")
    result, killed, stats = await _run_and_kill(cfg, workers, r)
    assert result.ok and result.stdout == "done\n"
    assert stats["reaped"] == 1
    assert killed in [p.pid for p in procs]


async def test_calls_admitted_in_one_round_share_one_lpush(redis_url):
    """The front end enqueues every call of one event-loop round with a single LPUSH (one round
    trip, one connection, however many calls); how many rounds a long batch takes is a timing,
    measured by `rstar2 bench-tools --client redis`, not asserted here."""
    cfg = RedisConfig(redis_url, namespace="t-push", lease=2.0)
    r = redis.Redis.from_url(redis_url)
    front = RedisFrontend(cfg)
    await front.start()
    try:
        calls = [asyncio.ensure_future(front.run(f"print({i})")) for i in range(200)]  # no worker: they wait
        await asyncio.to_thread(wait_for, lambda: r.llen(cfg.queue) == 200, "200 queued calls", 10)
        assert front.stats()["pushes"] == 1
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    finally:
        await front.close()
        r.delete(cfg.queue)


async def test_killed_worker_call_gets_an_error_result(redis_url, workers):
    cfg = RedisConfig(redis_url, namespace="t-fail", lease=2.0, max_attempts=1)
    r = redis.Redis.from_url(redis_url)
    workers.start(cfg)
    await asyncio.to_thread(wait_for, lambda: live_workers(r, cfg), "a worker heartbeat")
    result, killed, _ = await _run_and_kill(cfg, workers, r)
    assert result.reason == "internal_error" and "died while running this call" in result.stderr
    assert not list(r.scan_iter(match=cfg.processing("*")))  # nothing left behind in Redis


@pytest.mark.slow
def test_supervisor_replaces_a_dead_worker_process(redis_url):
    r = redis.Redis.from_url(redis_url)
    cfg = RedisConfig(redis_url, lease=2.0)  # the CLI's default namespace
    cli = [sys.executable, "-c", "from rstar2_cli.cli import app; app()", "serve-sandbox", "--worker",
           "--redis", redis_url, "--procs", "1", "--workers", "1", "--unsafe-no-isolation", "--lease", "2"]
    sup = subprocess.Popen(cli, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        first = wait_for(lambda: live_workers(r, cfg), "the first worker")[0]
        os.kill(int(first.split("-")[-2]), signal.SIGKILL)
        second = wait_for(lambda: [w for w in live_workers(r, cfg) if w != first], "a replacement worker")[0]
        assert second.split("-")[-2] != first.split("-")[-2]
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(20)
        with contextlib.suppress(ProcessLookupError):  # leftovers of the killed worker's pool
            os.killpg(sup.pid, signal.SIGKILL)
    assert b"replaced" in sup.stderr.read()


def held_by(r: redis.Redis, cfg: RedisConfig, pid: int) -> int:
    """Calls in the processing lists of the worker process `pid`."""
    return sum(r.llen(key) for key in r.scan_iter(match=cfg.processing("*"))
               if int(key.decode().rsplit(":", 1)[1].split("-")[-2]) == pid)


def kill_while_holding_calls(r: redis.Redis, cfg: RedisConfig, workers: Workers, pid: int) -> None:
    """SIGKILL the host `pid` at a moment it holds calls: freeze it (SIGSTOP), look, and kill it
    frozen, so the calls it held must be reaped; a host caught between two fetch rounds is let go
    on and caught again."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        os.killpg(pid, signal.SIGSTOP)
        if held_by(r, cfg, pid):
            workers.kill(pid)
            return
        os.killpg(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"worker host {pid} never held a call")


@pytest.mark.slow
def test_rl_sized_long_batch_survives_a_host_dying(redis_url, workers):
    """5,000 calls in one long-batch, two worker hosts, one killed (whole process group) a third
    of the way through: every call is answered once and correctly, none as internal_error, and
    the front end's Redis connections stay bounded (one connection per call in flight would fail
    past ~100)."""
    cfg = RedisConfig(redis_url, namespace="t-rl", lease=2.0, max_attempts=3)
    r = redis.Redis.from_url(redis_url)
    hosts = [workers.start(cfg, 16), workers.start(cfg, 16)]
    wait_for(lambda: len(live_workers(r, cfg)) == 2, "two worker heartbeats")
    n = 5000
    subs = [{"type": "python", "solution": f"import time\ntime.sleep(0.005)\nprint({i} * 3)"} for i in range(n)]
    front = RedisFrontend(cfg)
    with serve_in_thread(create_app(front, ServiceConfig(max_queue=1024, max_batch=n))) as url:
        with httpx.Client(timeout=900) as client:
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(client.post, f"{url}/run/long-batch", json={"type": "batch", "submissions": subs})
                wait_for(lambda: front.stats()["completed"] >= n // 3 or answer.done(), "a third of the calls",
                         limit=600)
                clients = int(r.info("clients")["connected_clients"])
                kill_while_holding_calls(r, cfg, workers, hosts[0].pid)
                response = answer.result(900)
        assert response.status_code == 200, response.text[:300]
        results = response.json()["results"]
        stats = front.stats()
    assert len(results) == n
    wrong = [(i, res["reason"], res["stdout"], res["stderr"][-100:]) for i, res in enumerate(results)
             if not res["run_success"] or res["stdout"] != f"{i * 3}\n"]
    assert wrong == []
    assert stats["completed"] == n and stats["errors"] == 0 and stats["reaped"] >= 1
    # 3 processes x max_connections, plus this test's own client
    assert clients <= 3 * cfg.max_connections + 1
