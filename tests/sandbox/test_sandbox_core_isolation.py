"""What a snippet must not be able to do: network, host files, env, other processes."""
from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from host_processes import host_processes_matching
from host_secret import HOST_SECRET_NAME, HOST_SECRET_VALUE
from sandbox.jail.backends import bwrap_problem

REPO = Path(__file__).resolve().parents[2]
needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason="bubblewrap unavailable here")


async def test_host_loopback_service_is_unreachable(jailed_pool):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        result = await jailed_pool.run(
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
    finally:
        server.close()
    assert result.reason == "runtime_error" and "connected" not in result.stdout


async def test_internet_is_unreachable(jailed_pool):
    result = await jailed_pool.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert result.reason == "runtime_error"
    assert "OSError" in result.stderr or "Error" in result.stderr


@needs_bwrap
async def test_filesystem_is_read_only_outside_scratch(jailed_pool):
    for path in ("/usr/evil", "/etc/evil", "/evil", "/tmp/evil", "/dev/shm/evil"):
        result = await jailed_pool.run(f"open({path!r}, 'w').write('x')")
        assert result.reason == "runtime_error", (path, result)
    ok = await jailed_pool.run("import os\nopen('note.txt', 'w').write('hi')\n"
                                "print(open('note.txt').read(), os.getcwd())")
    assert ok.stdout.startswith("hi /tmp/rstar2-scratch/slot"), ok


async def test_scratch_dir_is_wiped_between_calls(jailed_pool):
    await jailed_pool.run("open('left_behind.txt', 'w').write('x')\nimport os; os.mkdir('d')")
    # slots rotate: enough calls visit every slot of every worker
    slots = jailed_pool.stats()["slots_per_worker"] * jailed_pool.stats()["workers"]
    results = await jailed_pool.run_batch([{"code": "import os; print(sorted(os.listdir('.')))"}] * (2 * slots))
    assert {r.stdout for r in results} == {"[]\n"}


async def test_host_environment_is_invisible(jailed_pool):
    assert os.environ[HOST_SECRET_NAME] == HOST_SECRET_VALUE
    result = await jailed_pool.run(f"import os\nprint({HOST_SECRET_NAME!r} in os.environ, "
                                    f"{HOST_SECRET_VALUE!r} in open('/proc/1/environ', errors='replace').read() "
                                    "if os.access('/proc/1/environ', os.R_OK) else False)")
    assert result.stdout == "False False\n", result


async def test_home_and_tmpdir_are_the_calls_scratch_dir_for_python_and_subprocesses(jailed_pool):
    code = ("import os, subprocess, tempfile\n"
            "here = os.getcwd()\n"
            "sub = subprocess.run(['/bin/sh', '-c', 'echo $HOME $TMPDIR'], capture_output=True, text=True).stdout.split()\n"
            "fd, name = tempfile.mkstemp()\n"
            "print(os.environ['HOME'] == os.environ['TMPDIR'] == here, sub == [here, here],\n"
            "      os.path.dirname(name) == here, os.path.expanduser('~') == here)")
    results = await jailed_pool.run_batch([{"code": code}] * 3)
    assert [r.stdout for r in results] == ["True True True True\n"] * 3, results[0].stderr


@needs_bwrap
async def test_home_and_project_files_are_unreadable(jailed_pool):
    for path in (REPO / "pyproject.toml", Path.home() / ".bashrc", REPO / "sandbox" / "core" / "pool.py"):
        result = await jailed_pool.run(f"print(open({str(path)!r}).read()[:20])")
        assert result.reason == "runtime_error", (path, result)
    listing = await jailed_pool.run(f"import os\nprint(os.listdir({str(Path.home())!r}))")
    assert listing.reason == "runtime_error"


async def test_code_does_not_run_as_root_and_calls_have_distinct_uids(jailed_pool):
    code = "import os, time\ntime.sleep(0.3)\nprint(os.getuid(), os.geteuid())"
    results = await jailed_pool.run_batch([{"code": code}] * 3)
    uids = [tuple(map(int, r.stdout.split())) for r in results]
    assert all(u != 0 and e != 0 for u, e in uids)
    if os.geteuid() == 0:  # per-call uids are available when the host side runs as root
        assert len({u for u, _ in uids}) == 3


async def test_killing_parent_pid1_and_everything_does_not_hurt_the_pool(jailed_pool):
    parent = await jailed_pool.run("import os\nos.kill(os.getppid(), 9)")
    init = await jailed_pool.run("import os\nos.kill(1, 9)")
    assert parent.reason == init.reason == "runtime_error"
    assert "PermissionError" in parent.stderr
    await jailed_pool.run("import os, signal\nfor pid in range(1, 5000):\n    try:\n        os.kill(pid, 9)\n"
                           "    except OSError:\n        pass", timeout=3)
    restarts = jailed_pool.stats()["restarts"]
    assert (await jailed_pool.run("print('still here')")).stdout == "still here\n"
    assert jailed_pool.stats()["restarts"] == restarts


async def test_detached_processes_do_not_survive_the_call(jailed_pool):
    marker = f"{time.time_ns() % 10**9}"
    code = (f"import subprocess, os\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execvp('sleep', ['sleep', '{marker}1'])\n"
            "    os._exit(0)\nprint('spawned')")
    result = await jailed_pool.run(code)
    assert result.stdout == "spawned\n", result
    for _ in range(20):  # the kill is done before the answer; allow the kernel a moment to reap
        if not host_processes_matching(f"sleep {marker}"):
            break
        time.sleep(0.05)
    assert host_processes_matching(f"sleep {marker}") == []


async def test_detached_process_dies_even_when_other_calls_start_meanwhile(jailed_pool):
    marker = f"{time.time_ns() % 10**9}"
    spawner = asyncio.ensure_future(jailed_pool.run(
        f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\ntime.sleep(0.6)"))
    await asyncio.sleep(0.3)  # the spawn has happened; now the same zygote forks more calls
    await jailed_pool.run_batch([{"code": "import time; time.sleep(0.5)"}] * 3)
    assert (await spawner).ok
    for _ in range(20):
        if not host_processes_matching(f"sleep {marker}"):
            break
        time.sleep(0.05)
    assert host_processes_matching(f"sleep {marker}") == []
