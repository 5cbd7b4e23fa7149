"""`rstar2 serve-sandbox` (isolation gate, --check) and `rstar2 bench-tools` (report shape)."""
from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest
import typer
from service_fixtures import free_port, make_sandbox, post_batch, serve_in_thread
from typer.testing import CliRunner

from rstar2_cli.commands import sandbox as sandbox_commands
from sandbox.jail import backends
from sandbox.jail.backends import bwrap_problem, nsjail_problem
from sandbox.service.server import ServiceConfig, create_app

ROW_KEYS = {"workload", "mode", "concurrency", "calls", "seconds", "calls_per_s", "p50_ms", "p95_ms", "p99_ms",
            "errors", "vs_baseline", "first_error"}


@pytest.fixture(scope="module")
def cli():
    app = typer.Typer()
    sandbox_commands.register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


@pytest.mark.skipif(nsjail_problem() is not None and bwrap_problem() is not None,
                    reason="neither nsjail nor bubblewrap can run here")
def test_check_reports_protections_and_exits_0_when_isolated(cli):
    res = cli("serve-sandbox", "--check", "--workers", "1")
    assert res.exit_code == 0, res.output
    assert "sandbox protections" in res.output and "network" in res.output
    assert "nsjail" in res.output or "bwrap" in res.output
    assert "NOT isolated" not in res.output


def test_check_exits_1_when_isolation_is_unavailable(cli, monkeypatch):
    monkeypatch.setattr(backends, "locate_nsjail", lambda: None)
    res = cli("serve-sandbox", "--check", "--isolation", "nsjail")
    assert res.exit_code == 1
    assert "NOT isolated" in res.output and "nsjail" in res.output


def test_the_served_pool_knows_the_rl_runner_and_the_codejudge_template():
    """`serve-sandbox` serves RL's calls (wrapped in its runner) and code-judge clients' (wrapped in
    the release's template): its pools, local or on Redis workers, take the fast path for both."""
    from rstar2_cli.protocol.code_runner import release_runner_source
    from sandbox.service.embedded import sandbox_from_kwargs
    from sandbox.service.executor_template import wrap_code

    kwargs = sandbox_commands.pool_kwargs(1, "none", True, 10.0, 1024, 65536)
    kwargs = json.loads(json.dumps(kwargs))  # as Redis workers get them, on their command line
    known = sandbox_from_kwargs(kwargs).preludes
    assert known.recognise(release_runner_source("print(1)")) is not None
    assert known.recognise(wrap_code("print(1)")) is not None


def test_serve_refuses_to_run_unconfined_without_the_flag(cli):
    res = cli("serve-sandbox", "--isolation", "none", "--port", "1")
    assert res.exit_code == 2 and "--unsafe-no-isolation" in res.output


def test_worker_needs_redis(cli):
    res = cli("serve-sandbox", "--worker")
    assert res.exit_code == 2 and "--redis" in res.output


def test_bench_tools_writes_report_with_baseline(cli, tmp_path):
    out = tmp_path / "bench.json"
    res = cli("bench-tools", "--calls", "4", "--concurrency", "1,2", "--workloads", "trivial,error,timeout",
              "--baseline-calls", "2", "--workers", "1", "--unsafe-no-isolation", "--json", str(out))
    assert res.exit_code == 0, res.output
    assert "bench-tools (embedded)" in res.output and "wrote" in res.output
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert report["target"] == "embedded" and len(rows) == 12 and all(set(r) == ROW_KEYS for r in rows)
    assert {(r["workload"], r["mode"], r["concurrency"]) for r in rows} == {
        (w, m, c) for w in ("trivial", "error", "timeout") for m in ("sandbox", "baseline") for c in (1, 2)}
    assert all(r["errors"] == 0 and r["first_error"] is None for r in rows)  # expected outcomes, both sides
    base = {(r["workload"], r["concurrency"]): r["calls_per_s"] for r in rows if r["mode"] == "baseline"}
    assert all(r["vs_baseline"] == round(r["calls_per_s"] / base[r["workload"], r["concurrency"]], 2)
               for r in rows if r["mode"] == "sandbox")                 # each row against its own baseline
    assert all(r["calls"] == (4 if r["mode"] == "sandbox" else 2) for r in rows)


def test_bench_tools_against_a_server(cli, tmp_path):
    out = tmp_path / "remote.json"
    with serve_in_thread(create_app(make_sandbox(workers=1), ServiceConfig())) as url:
        res = cli("bench-tools", "--url", url, "--no-baseline", "--calls", "3", "--concurrency", "2",
                  "--workloads", "trivial,timeout", "--json", str(out))
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["target"] == url and [r["mode"] for r in report["rows"]] == ["sandbox", "sandbox"]
    assert all(r["errors"] == 0 and r["vs_baseline"] is None for r in report["rows"])


def test_bench_tools_gives_up_on_a_server_that_never_answers():
    """A port that accepts connections and says nothing (a mistyped port, a hung server) is one
    ValueError after the probe's timeout, not the client's retries."""
    import asyncio
    import socket

    from rstar2_cli.sandbox_bench.plain import probe_server

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ValueError, match=f"^--url {url}: no sandbox server answers .*ReadTimeout"):
            asyncio.run(probe_server(url, timeout=0.2))


def test_bench_tools_rejects_bad_flags(cli):
    res = cli("bench-tools", "--concurrency", "1,x")
    assert res.exit_code == 2 and "--concurrency" in res.output
    res = cli("bench-tools", "--workloads", "trivial,nope", "--no-baseline")
    assert res.exit_code == 2 and "nope" in res.output


@pytest.mark.slow
@pytest.mark.skipif(nsjail_problem() is not None and bwrap_problem() is not None,
                    reason="neither nsjail nor bubblewrap can run here")
def test_serve_sandbox_command_serves_and_stops_cleanly():
    port = free_port()
    cmd = [sys.executable, "-c", "from rstar2_cli.cli import app; app()", "serve-sandbox", "--port", str(port),
           "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/ping").status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "serve-sandbox did not come up"
            time.sleep(0.1)
        result = post_batch(url, [{"type": "python", "solution": "print(6*7)"}]).json()["results"][0]
        assert result["stdout"] == "42\n" and result["success"]
        assert httpx.get(f"{url}/protections").json()["backend"] in ("nsjail", "bwrap")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful stop
    assert b"http://127.0.0.1" in proc.stderr.read()
