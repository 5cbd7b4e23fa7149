"""Request/response shapes of the embedded Sandbox API."""
from __future__ import annotations

import pytest

from sandbox import RunResult, Sandbox, SandboxUnavailable
from sandbox.jail import backends
from sandbox.jail.backends import bwrap_problem, nsjail_problem

EXPECTED_JAIL = "nsjail" if nsjail_problem() is None else "bwrap" if bwrap_problem() is None else None


async def test_run_returns_a_complete_result(sandbox_pool):
    result = await sandbox_pool.run("print(1 + 1)")
    assert isinstance(result, RunResult)
    assert (result.stdout, result.stderr, result.exit_code, result.reason, result.ok) == ("2\n", "", 0, "ok", True)
    assert result.wall_time > 0
    assert set(result.to_dict()) == {"stdout", "stderr", "exit_code", "wall_time", "reason"}


async def test_preloaded_sympy_and_numpy_work(sandbox_pool):
    result = await sandbox_pool.run("import sympy, numpy as np\nprint(sympy.factorint(2**61-1), np.arange(4).sum())")
    assert result.stdout == "{2305843009213693951: 1} 6\n", result.stderr


async def test_stdin_and_echo(sandbox_pool):
    result = await sandbox_pool.run("n = int(input())\nn * n", stdin="12\n")
    assert result.stdout == "144\n"


async def test_runtime_error_is_short(sandbox_pool):
    result = await sandbox_pool.run("x = 1\ny = x / 0")
    assert result.reason == "runtime_error" and result.exit_code == 1
    assert result.stderr == "Line 2: ZeroDivisionError: division by zero\n    y = x / 0\n"


async def test_run_batch_keeps_input_order(sandbox_pool):
    items = [{"code": f"import time; time.sleep({0.05 * (i % 3)}); print({i})"} for i in range(12)]
    items.append({"code": "print(input())", "stdin": "last"})
    results = await sandbox_pool.run_batch(items)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)] + ["last\n"]


async def test_run_batch_rejects_items_without_code(sandbox_pool):
    with pytest.raises(ValueError, match=r"items\[1\]"):
        await sandbox_pool.run_batch([{"code": "1"}, {"stdin": "x"}])


def test_run_sync_and_bad_arguments(sandbox_pool):
    assert sandbox_pool.run_sync("21 * 2").stdout == "42\n"
    with pytest.raises(ValueError, match="code"):
        sandbox_pool.run_sync(b"print(1)")


def test_stats_report_the_pool(sandbox_pool):
    stats = sandbox_pool.stats()
    assert {"workers", "busy", "queued", "completed", "errors", "restarts"} <= set(stats)
    assert stats["workers"] >= 1 and stats["completed"] >= 1


@pytest.mark.skipif(EXPECTED_JAIL is None, reason="neither nsjail nor bubblewrap can run here")
def test_protections_are_measured_and_active(sandbox_pool):
    found = sandbox_pool.protections()
    assert found["backend"] == EXPECTED_JAIL
    for key in ("network", "readonly_fs", "env_cleared", "home_hidden", "project_hidden", "non_root",
                "per_call_uid", "pool_unsignalable", "rlimits", "pid_namespace", "no_new_privs"):
        assert found[key] is True, key


def test_unavailable_isolation_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(backends, "locate_nsjail", lambda: None)
    with pytest.raises(SandboxUnavailable, match="nsjail"):
        Sandbox(isolation="nsjail").run_sync("1")
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="chroot").run_sync("1")
    with pytest.raises(ValueError, match="workers"):
        Sandbox(workers=0)



def test_a_pool_on_its_starters_loop_serves_that_loop_and_others():
    """own_thread=False: the pool lives on the loop that starts it, with
    no thread of its own, still answers callers on other threads' loops, and refuses a blocking
    run_sync on its own loop."""
    import asyncio
    import threading

    from sandbox import Limits

    async def main():
        before = set(threading.enumerate())
        pool = Sandbox(workers=1, preload=("math",), own_thread=False, limits=Limits(timeout=5.0, cpu_time=5.0))
        await pool.start()
        try:
            new_threads = [t.name for t in set(threading.enumerate()) - before  # asyncio's own child watchers aside
                           if not t.name.startswith("asyncio-waitpid")]
            here = await pool.run("print(6*7)")
            there: list = []
            thread = threading.Thread(target=lambda: there.append(asyncio.run(pool.run("print(7*6)"))))
            thread.start()
            await asyncio.get_running_loop().run_in_executor(None, thread.join)
            with pytest.raises(RuntimeError, match="own event loop"):
                pool.run_sync("print(1)")
            return new_threads, here, there[0]
        finally:
            await pool.close()

    new_threads, here, there = asyncio.run(main())
    assert (new_threads, here.stdout, there.stdout) == ([], "42\n", "42\n")


def test_a_pool_on_its_starters_loop_needs_one():
    with pytest.raises(RuntimeError, match="running event loop"):
        Sandbox(workers=1, preload=("math",), own_thread=False).run_sync("print(1)")


async def test_a_compile_warning_reaches_the_calls_stderr(sandbox_pool):
    """Short cells are compiled in the zygote before the fork; one that warns is compiled in the
    child instead, so the warning is the call's output, as under `python -c`."""
    r = await sandbox_pool.run("x = 1\nprint(x is 1)")
    assert r.ok and r.stdout == "True\n"
    assert 'SyntaxWarning: "is" with a literal' in r.stderr
