"""Measure which protections are really in force, by running a probe snippet through the pool.

`Sandbox.protections()` reports these findings (not the configuration we asked for), so
`rstar2 serve-sandbox --check` tells the truth on machines where a namespace or capability
silently failed to apply.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from sandbox.jail.paths import JailPaths

_ALLOWED_ENV = {"PATH", "HOME", "TMPDIR", "LANG", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                "MKL_NUM_THREADS", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE"}

PROBE = r'''
import json, os, resource, socket, sys
args = json.loads(ARGS)
r = {}
def fails(fn):
    try:
        fn()
    except OSError:
        return True
    return False
def connect(host, port):
    s = socket.socket(); s.settimeout(1.0)
    try:
        s.connect((host, port))
    finally:
        s.close()
r["host_loopback_blocked"] = fails(lambda: connect("127.0.0.1", args["port"]))
r["internet_blocked"] = fails(lambda: connect("1.1.1.1", 53))
r["interfaces"] = [name for _, name in socket.if_nameindex()]
def write(path):
    with open(os.path.join(path, ".rstar2-probe"), "w") as f:
        f.write("x")
r["readonly_fs"] = all(fails(lambda p=p: write(p)) for p in args["ro_paths"])
r["scratch_writable"] = not fails(lambda: write(os.getcwd()))
def hidden(path, shown):
    try:
        return not set(os.listdir(path)) - set(shown)
    except OSError:
        return True
r["home_hidden"] = hidden(*args["home"])
r["project_hidden"] = all(hidden(path, shown) for path, shown in args["project"])
r["env_leaked"] = sorted(k for k in os.environ if k in set(args["host_env"]))
r["uid"] = os.getuid(); r["euid"] = os.geteuid()
with open(f"/proc/{os.getppid()}/status") as f:
    r["parent_uid"] = int(next(l for l in f if l.startswith("Uid:")).split()[1])
r["parent_signal_blocked"] = fails(lambda: os.kill(os.getppid(), 0))
r["rlimits"] = {name: resource.getrlimit(getattr(resource, name))[1] != resource.RLIM_INFINITY
                for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NPROC")}
def start_time(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
r["host_process_hidden"] = start_time(args["host_pid"]) != args["host_start"]
with open("/proc/self/status") as f:
    status = dict(l.split(":", 1) for l in f if ":" in l)
r["no_new_privs"] = status.get("NoNewPrivs", "0").strip() == "1"
r["cap_eff"] = status.get("CapEff", "").strip()
print(json.dumps(r))
'''


async def probe_protections(run, backend: str, paths: JailPaths) -> dict:
    """`run(code)` executes one snippet in the pool; returns the protections dict. A folder counts
    as hidden when the jail shows none of its entries but those it mounts by design
    (`JailPaths.shown_names`: a checkout's `.venv`, the interpreter under a home); the project is
    every folder of `paths.project` (the working folder and a source checkout: sandbox.jail.paths),
    wherever the sandbox package itself is installed."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with open("/proc/self/stat") as f:
        host_start = f.read().rsplit(")", 1)[1].split()[19]
    args = {"port": port, "ro_paths": ["/", "/usr", "/etc", "/tmp", os.path.dirname(os.__file__)],
            "home": [str(Path.home()), paths.shown_names(str(Path.home()))],
            "project": [[p, paths.shown_names(p)] for p in paths.project],
            "host_env": sorted(set(os.environ) - _ALLOWED_ENV),
            "host_pid": os.getpid(), "host_start": host_start}
    try:
        result = await run(f"ARGS = {json.dumps(args)!r}\n{PROBE}")
    finally:
        server.close()
    if not result.ok:
        return {"backend": backend, "probe_error": (result.stderr or result.reason)[-500:]}
    found = json.loads(result.stdout.strip().splitlines()[-1])
    return {
        "backend": backend,
        "network": found["host_loopback_blocked"] and found["internet_blocked"],
        "readonly_fs": found["readonly_fs"] and found["scratch_writable"],
        "env_cleared": not found["env_leaked"],
        "home_hidden": found["home_hidden"],
        "project_hidden": found["project_hidden"],
        "non_root": found["uid"] != 0 and found["euid"] != 0,
        "per_call_uid": found["uid"] != found["parent_uid"],
        "pool_unsignalable": found["parent_signal_blocked"],
        "rlimits": all(found["rlimits"].values()),
        "pid_namespace": found["host_process_hidden"],
        "no_new_privs": found["no_new_privs"],
        "no_capabilities": int(found["cap_eff"] or "0", 16) == 0,
    }
