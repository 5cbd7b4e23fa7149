"""Hostile or broken snippets, and dying workers, never take the pool down."""
from __future__ import annotations

import asyncio
import os
import signal


async def test_os_exit_and_self_kill(sandbox_pool):
    exited = await sandbox_pool.run("import os\nprint('bye', flush=True)\nos._exit(3)")
    assert (exited.exit_code, exited.reason, exited.stdout) == (3, "runtime_error", "bye\n")
    killed = await sandbox_pool.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert killed.reason == "runtime_error" and killed.exit_code is None and "SIGKILL" in killed.stderr


async def test_closed_stdout_does_not_hang(sandbox_pool):
    result = await sandbox_pool.run("import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)\nx = 1")
    assert result.reason == "ok"


async def test_system_exit_and_keyboard_interrupt(sandbox_pool):
    assert (await sandbox_pool.run("import sys\nsys.exit(0)")).reason == "ok"
    assert (await sandbox_pool.run("raise KeyboardInterrupt")).reason == "runtime_error"


async def test_both_tiers_offer_the_same_builtins_and_stdlib(sandbox_pool):
    # the light tier starts without `site` (sandbox.jail.backends): exit/quit/help must still be there
    for prefix in ("", "import sympy\n"):  # light tier, heavy tier
        assert (await sandbox_pool.run(prefix + "exit(3)")).exit_code == 3
        assert (await sandbox_pool.run(prefix + "quit()")).reason == "ok"
        probe = await sandbox_pool.run(prefix + "import json, fractions\nprint(callable(help), json.dumps([1]))")
        assert probe.stdout == "True [1]\n", probe


async def test_killed_worker_fails_in_flight_call_and_is_replaced(sandbox_pool):
    restarts = sandbox_pool.stats()["restarts"]
    # `sympy` routes the call to the heavy tier; kill every heavy worker while the call sleeps
    pending = asyncio.ensure_future(sandbox_pool.run("import sympy, time\ntime.sleep(30)", timeout=60))
    await asyncio.sleep(0.5)
    heavy = [w.pid for w in sandbox_pool._workers if w.tier == "heavy" and w.alive]
    for pid in heavy:
        os.kill(pid, signal.SIGKILL)
    result = await asyncio.wait_for(pending, 30)
    assert result.reason == "internal_error"
    after = await sandbox_pool.run("import sympy\nprint(sympy.isprime(97))")
    assert after.stdout == "True\n", after
    assert sandbox_pool.stats()["restarts"] >= restarts + len(heavy)
    assert sandbox_pool.stats()["errors"] >= 1


async def test_calls_queued_behind_busy_slots_still_get_their_whole_timeout(sandbox_pool):
    """More calls than slots wait in the zygote's queue; a call's time limit starts when it runs,
    so a short call queued behind slow ones is not timed out by the wait."""
    slots = sandbox_pool.stats()["slots_per_worker"]
    slow = [sandbox_pool.run("import time\ntime.sleep(1.0)\nprint('slow')") for _ in range(slots)]
    queued = sandbox_pool.run("import time\ntime.sleep(0.3)\nprint('queued')", timeout=0.9)
    results = await asyncio.gather(*slow, queued)
    assert [r.stdout for r in results] == ["slow\n"] * slots + ["queued\n"]
    assert results[-1].reason == "ok" and results[-1].wall_time < 0.9
