"""Multi-node mode against a real redis-server: the HTTP front end queues calls, worker processes
run them, and a worker killed mid-call never loses the call (requeued, or an error result)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
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


def test_connections_carry_redis_pys_retry_with_exponential_backoff():
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    from sandbox.redis_mode.wire import RETRIED_ERRORS, connect, retry_policy

    cfg = RedisConfig("redis://127.0.0.1:1/0", retries=5, backoff_base=0.1, backoff_cap=1.5)
    policy = retry_policy(cfg)
    assert policy == Retry(ExponentialBackoff(cap=1.5, base=0.1), 5, supported_errors=RETRIED_ERRORS)
    client = connect(cfg)
    assert client.connection_pool.connection_kwargs["retry"] == policy
    assert client.connection_pool.make_connection().retry == policy   # what each command retries with
    for bad in ({"retries": 0}, {"backoff_base": 0}, {"backoff_cap": -1.0}):
        with pytest.raises(ValueError, match=f"RedisConfig.{next(iter(bad))}"):
            RedisConfig("redis://127.0.0.1:1/0", **bad)


class RestartableRedis:
    """A redis-server without persistence on a port of its own that can be killed and started
    again on the same port (what a restarted Redis host looks like to its clients)."""

    def __init__(self):
        from sandbox.redis_mode.local_server import free_port

        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)

        def up():
            with contextlib.suppress(redis.RedisError):
                return client.ping()
        wait_for(up, "redis-server to answer", 20)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def test_a_call_running_while_redis_restarts_is_answered(workers):
    """Redis SIGKILLed while a worker runs a call and started again (empty) after the call ended:
    the worker's answer and the front end's reply listener wait in redis-py's retries, the call
    is answered, and new calls flow again."""
    server = RestartableRedis()
    server.start()
    try:
        cfg = RedisConfig(server.url, namespace="t-restart", lease=2.0)
        r = redis.Redis.from_url(server.url)
        workers.start(cfg)
        await asyncio.to_thread(wait_for, lambda: live_workers(r, cfg), "a worker heartbeat")
        async with RedisFrontend(cfg) as front:
            call = asyncio.create_task(front.run(SLOW))
            await asyncio.to_thread(wait_for, lambda: holder_pid(r, cfg), "a worker to take the call")
            server.kill()
            await asyncio.sleep(3.0)            # the call ends on the worker while Redis is down
            server.start()
            result = await asyncio.wait_for(call, 60)
            assert result.ok and result.stdout == "done\n"
            again = await asyncio.wait_for(front.run("print(5)"), 60)
            assert again.ok and again.stdout == "5\n"
    finally:
        workers.stop_all()                      # before Redis goes: they say goodbye through it
        server.kill()


def test_a_call_moved_without_the_worker_hearing_it_is_picked_up_once(redis_url, workers):
    """A call in a live worker's processing list that the worker does not hold (a BLMOVE that
    redis-py resent after its first send moved the call and lost the answer) is run by that
    worker's sweep, answered once, and leaves the list."""
    cfg = RedisConfig(redis_url, namespace="t-orphan", lease=1.0)
    r = redis.Redis.from_url(redis_url)
    workers.start(cfg)
    worker = wait_for(lambda: live_workers(r, cfg), "a worker heartbeat")[0]
    reply = cfg.reply("test")
    work = {"id": "orphan", "code": "print('found')", "stdin": None, "timeout": None, "reply_to": reply,
            "attempts": 0, "deadline": time.time() + 60}
    r.lpush(cfg.processing(worker), json.dumps(work))
    got = r.blpop([reply], timeout=20)
    assert got is not None, "the worker never ran the call in its processing list"
    message = json.loads(got[1])
    assert message["id"] == "orphan" and message["result"]["stdout"] == "found\n"
    wait_for(lambda: r.llen(cfg.processing(worker)) == 0, "the call to leave the processing list", 10)
    time.sleep(2.5)                              # two more sweeps: an answered call is not run again
    assert r.llen(reply) == 0


def test_calls_that_cannot_be_enqueued_past_the_retries_are_internal_errors():
    """Redis gone for longer than redis-py's retries: the HTTP front end answers each call with an
    internal_error result (what RemoteSandbox and RoC treat as an infrastructure failure)."""
    server = RestartableRedis()
    server.start()
    try:
        cfg = RedisConfig(server.url, namespace="t-down", retries=2, backoff_base=0.05, backoff_cap=0.2)
        with serve_in_thread(create_app(RedisFrontend(cfg), ServiceConfig(max_queue=8))) as url:
            server.kill()
            results = post_batch(url, [{"type": "python", "solution": "print(1)"}] * 2).json()["results"]
            status = httpx.get(f"{url}/status").json()
            server.start()                      # let the front end close cleanly
    finally:
        server.kill()
    assert [r["reason"] for r in results] == ["internal_error"] * 2
    assert all("could not enqueue the call in Redis" in r["stderr"] for r in results)
    assert status["counters"]["internal_error"] >= 2
