"""Per-call limits: wall time, memory, output size, processes."""
from __future__ import annotations

import pytest

from sandbox import Limits, Sandbox, SandboxUnavailable


async def test_infinite_loop_times_out(jailed_pool):
    result = await jailed_pool.run("while True:\n    pass", timeout=1.0)
    assert (result.reason, result.exit_code) == ("timeout", None)
    assert "Timeout" in result.stderr


async def test_sleep_forever_times_out_and_keeps_partial_output(jailed_pool):
    result = await jailed_pool.run("print('started')\nimport time\ntime.sleep(10**6)", timeout=1.0)
    assert result.reason == "timeout" and result.stdout == "started\n"


async def test_huge_allocation_is_a_memory_error(jailed_pool):
    result = await jailed_pool.run("x = bytearray(10 * 1024**3)")
    assert result.reason == "memory", result
    numpy_result = await jailed_pool.run("import numpy as np\na = np.ones(2 * 10**9)")
    assert numpy_result.reason == "memory", numpy_result


async def test_memory_below_the_limit_is_fine(jailed_pool):
    result = await jailed_pool.run("x = bytearray(200 * 1024**2); print(len(x))")
    assert result.ok, result


async def test_output_is_capped(jailed_pool):
    result = await jailed_pool.run("print('x' * 200_000)")
    assert result.reason == "output_limit"
    assert len(result.stdout) + len(result.stderr) <= 65536 + 200  # cap plus our one-line note


async def test_endless_printing_is_stopped(jailed_pool):
    result = await jailed_pool.run("while True:\n    print('spam' * 100)")
    assert result.reason == "output_limit"


async def test_output_of_a_stopped_call_never_reaches_a_later_call(jailed_pool):
    # each slot reuses its pipes: what a killed call (or its daemon) was still writing must go
    noisy = ("import os, subprocess, sys\n"
             "subprocess.Popen([sys.executable, '-c', 'while True: print(\"daemon\", flush=True)'],"
             " start_new_session=True)\n"
             "while True:\n    print('noise ' * 50, flush=True)")
    ended = await jailed_pool.run_batch([{"code": noisy}] * 8, timeout=0.5)
    assert {r.reason for r in ended} <= {"output_limit", "timeout"}, ended
    later = await jailed_pool.run_batch([{"code": f"print({i})"} for i in range(32)])
    assert [r.stdout for r in later] == [f"{i}\n" for i in range(32)], later


async def test_process_limit_contains_a_fork_bomb(jailed_pool):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = await jailed_pool.run(bomb, timeout=2.0)
    assert result.reason == "timeout"
    assert (await jailed_pool.run("print('alive')")).stdout == "alive\n"


async def test_processes_are_limited(jailed_pool):
    code = ("import os\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
            "            import time; time.sleep(30)\n        n += 1\nexcept OSError:\n    pass\nprint(n)")
    result = await jailed_pool.run(code, timeout=3.0)
    assert result.ok, result
    assert int(result.stdout) < 40  # Limits.max_processes is 32


async def test_cpu_time_limit_stops_busy_code():
    async with Sandbox(workers=1, preload=("math",), limits=Limits(cpu_time=1, timeout=30)) as pool:
        result = await pool.run("while True:\n    pass")
    assert (result.reason, result.exit_code) == ("timeout", None)
    assert "CPU time limit" in result.stderr


def test_unconfined_mode_needs_explicit_consent():
    with pytest.raises(SandboxUnavailable, match="unsafe_no_isolation"):
        Sandbox(isolation="none").run_sync("1")
