"""What a snippet must not be able to do: network, host files, env, other processes.

Each jail check that can have one runs beside a positive control: the same snippet on a pool with
no jail (`unconfined_pool`) reaches what the jailed call must not, so a jail that silently stopped
confining fails here even on a machine with no network.
"""
from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

from host_processes import host_processes_matching
from host_secret import HOST_SECRET_NAME, HOST_SECRET_VALUE

REPO = Path(__file__).resolve().parents[2]


async def _jailed_and_unconfined(jailed_pool, unconfined_pool, code: str):
    return await asyncio.gather(jailed_pool.run(code), unconfined_pool.run(code))


async def test_host_loopback_service_is_unreachable(jailed_pool, unconfined_pool):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    try:
        jailed, control = await _jailed_and_unconfined(jailed_pool, unconfined_pool, code)
    finally:
        server.close()
    assert control.stdout == "connected\n", control  # the test's listener is there to be reached
    assert jailed.reason == "runtime_error" and "connected" not in jailed.stdout


async def test_calls_have_a_network_of_their_own_with_only_loopback(jailed_pool, unconfined_pool):
    code = ("import os, socket\n"
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    internet = 'reached'\n"
            "except OSError as e:\n    internet = type(e).__name__\n"
            "print(os.readlink('/proc/self/ns/net'), ','.join(n for _, n in socket.if_nameindex()), internet)")
    jailed, control = await _jailed_and_unconfined(jailed_pool, unconfined_pool, code)
    host_net = os.readlink("/proc/self/ns/net")
    assert control.stdout.split()[0] == host_net, control  # unjailed, a call shares the host's network
    net, interfaces, internet = jailed.stdout.split()
    assert net != host_net and interfaces == "lo" and internet != "reached", jailed


async def test_host_processes_are_invisible(jailed_pool, unconfined_pool):
    """The pid namespace: this test process, alive on the host, does not exist for a jailed call."""
    with open("/proc/self/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]  # with the pid: this very process, not a reuse
    code = (f"try:\n    print(open('/proc/{os.getpid()}/stat').read().rsplit(')', 1)[1].split()[19] == {start!r})\n"
            "except OSError:\n    print(False)")
    jailed, control = await _jailed_and_unconfined(jailed_pool, unconfined_pool, code)
    assert control.stdout == "True\n", control
    assert jailed.stdout == "False\n", jailed


async def test_filesystem_is_read_only_outside_scratch(jailed_pool, unconfined_pool):
    marker = f"rstar2-isolation-{os.getpid()}-{time.time_ns()}"
    for host_dir in ("/tmp", "/dev/shm"):  # world-writable on the host: an unjailed call writes there
        path = Path(host_dir) / marker
        code = f"open({str(path)!r}, 'w').write('x')"
        control = await unconfined_pool.run(code)
        try:
            assert control.ok and path.exists(), (path, control)
        finally:
            path.unlink(missing_ok=True)
        jailed = await jailed_pool.run(code)
        assert jailed.reason == "runtime_error" and not path.exists(), (path, jailed)
    for path in ("/usr/evil", "/etc/evil", "/evil"):  # no control: unjailed as root, that would write the host
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
    code = (
        "import os, subprocess, tempfile\n"
        "here = os.getcwd()\n"
        "sub = subprocess.run(['/bin/sh', '-c', 'echo $HOME $TMPDIR'], capture_output=True, text=True).stdout.split()\n"
        "fd, name = tempfile.mkstemp()\n"
        "print(os.environ['HOME'] == os.environ['TMPDIR'] == here, sub == [here, here],\n"
        "      os.path.dirname(name) == here, os.path.expanduser('~') == here)"
    )
    results = await jailed_pool.run_batch([{"code": code}] * 3)
    assert [r.stdout for r in results] == ["True True True True\n"] * 3, results[0].stderr


async def test_home_and_project_files_are_unreadable(jailed_pool, unconfined_pool):
    project_file = REPO / "pyproject.toml"
    control = await unconfined_pool.run(f"print(open({str(project_file)!r}).read()[:20])")
    assert control.ok and control.stdout == project_file.read_text()[:20] + "\n", control
    for path in (project_file, Path.home() / ".bashrc", REPO / "sandbox" / "core" / "pool.py"):
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
