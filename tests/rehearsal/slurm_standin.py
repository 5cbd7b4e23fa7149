"""Stand-ins for SLURM's `sbatch`, `srun` and `scontrol` that run a job's steps as local processes.

Why: `rstar2_cli/recipes/slurm_rl.sbatch` is the launch the project exists for, and it must be
rehearsed as shipped on a machine without SLURM (CI, a laptop). `tests/rehearsal/bin/` holds the
three commands (each a call into this module); the rehearsal puts that folder first on PATH, so the
template, unchanged, talks to them as it would to SLURM.

The allocation: the hosts of RSTAR2_STANDIN_NODES (comma-separated; addresses of this machine, e.g.
127.0.0.2,127.0.0.3: all of 127/8 is loopback), SLURM_CPUS_ON_NODE from RSTAR2_STANDIN_CPUS (default:
this machine's CPUs). The job state lives under RSTAR2_STANDIN_SPOOL (jobs/<id>/: the script as
submitted, its state, exit code, restarts and the batch shell's pid).

What they honour, as SLURM does:
- sbatch: the script's #SBATCH lines, overridden by its own options; `--export=ALL,VAR=value` (and
  NONE), `--dependency=afterok:ID[:ID]` (the job starts when those completed with exit 0, and is
  cancelled, DependencyNeverSatisfied, when one did not), `--nodes`, `--output` (%j, %x) with
  `--open-mode`, `--parsable`. The job runs detached; the batch shell gets SLURM_JOB_ID,
  SLURM_JOB_NUM_NODES, SLURM_JOB_NODELIST, SLURM_CPUS_ON_NODE, SLURM_RESTART_COUNT, ...
  When the batch shell exits, every process of the job still alive is sent SIGTERM and, KILL_WAIT_S
  later, SIGKILL (slurmd ends a job's steps with it); a job marked by `scontrol requeue` then runs
  again with the same id and SLURM_RESTART_COUNT + 1.
- srun (inside a job): `--nodes`, `--ntasks`, `--ntasks-per-node`, `-w/--nodelist`, `--overlap`,
  `--cpus-per-task`, `--export`, `--kill-on-bad-exit`; each task is a local process with
  SLURM_NODEID, SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME, SLURM_STEP_* set. A signal srun gets
  (USR1, USR2, TERM, INT, HUP, CONT) goes to every process of every task, as slurmstepd signals a
  step's whole process container (proctrack). Its exit code is the tasks' highest (128 + N for a task
  ended by signal N); with --kill-on-bad-exit a task's non-zero exit ends the others (TERM, then
  KILL after KILL_WAIT_S), and srun names the host and task in one line, as srun does:
  `srun: error: HOST: task N: Exited with exit code C`.
- scontrol: `show hostnames LIST`, `requeue ID`, `show job ID` (JobState, ExitCode, Restarts).
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

KILL_WAIT_S = 5.0           # slurm.conf KillWait (30 s by default): TERM, then KILL this much later
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCONT)
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
JOB_MARKER = "RSTAR2_STANDIN_JOB"   # in every job process's environment: "<spool>:<id>"


class Usage(Exception):
    """A bad command line: one line, exit 1 (as SLURM's commands)."""


def spool() -> Path:
    root = os.environ.get("RSTAR2_STANDIN_SPOOL")
    if not root:
        raise Usage("RSTAR2_STANDIN_SPOOL is not set (the rehearsal's job state folder)")
    return Path(root)


def job_dir(job_id: str, root: Path | None = None) -> Path:
    return (root or spool()) / "jobs" / str(job_id)


def read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return default


def write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def expand_hostnames(nodelist: str) -> list[str]:
    """`scontrol show hostnames`: `n[01-03,7],m1` -> n01 n02 n03 n07 m1."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist + ","):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            if nodelist[start:i]:
                items.append(nodelist[start:i])
            start = i + 1
    hosts = []
    for item in items:
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not m:
            hosts.append(item)
            continue
        for part in m.group(2).split(","):
            lo, _, hi = part.partition("-")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{m.group(1)}{n:0{len(lo)}d}{m.group(3)}")
    return hosts


def export_env(spec: str, base: dict[str, str]) -> dict[str, str]:
    """`--export=ALL,VAR=value,...` (or NONE,...): the environment it gives."""
    parts = spec.split(",")
    env = dict(base) if parts[0] == "ALL" else {k: v for k, v in base.items() if k.startswith("SLURM")}
    for part in parts[1:] if parts[0] in ("ALL", "NONE") else parts:
        name, eq, value = part.partition("=")
        if eq:
            env[name] = value
        elif name in base:
            env[name] = base[name]
    return env


def parse_options(args: list[str], known: dict[str, bool]) -> tuple[dict[str, str], list[str]]:
    """Options up to the first operand: `known` maps a long name (or `-x`) to whether it takes a value.
    Returns ({name: value}, the rest)."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in known:
            raise Usage(f"unrecognized option '{arg}'")
        if known[name] and not eq:
            if i + 1 >= len(args):
                raise Usage(f"option '{name}' requires an argument")
            value, i = args[i + 1], i + 1
        opts[ALIASES.get(name, name)] = value if known[name] else (value or "1")
        i += 1
    return opts, args[i:]


ALIASES = {"-N": "--nodes", "-n": "--ntasks", "-w": "--nodelist", "-c": "--cpus-per-task", "-o": "--output",
           "-J": "--job-name", "-t": "--time", "-d": "--dependency", "-D": "--chdir", "-K": "--kill-on-bad-exit"}


# ---------------------------------------------------------------- processes of a job

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def process_tree(roots: list[int]) -> list[int]:
    """`roots` and all their descendants, alive now."""
    kids, seen, todo = _children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen and Path(f"/proc/{pid}").exists():
            seen.append(pid)
            todo.extend(kids.get(pid, []))
    return seen


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment carries JOB_MARKER=marker (every process a job started, even
    one that left its parent's tree), this one excluded."""
    found, needle = [], f"{JOB_MARKER}={marker}\0".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes() + b"\0":
                    found.append(int(entry))
            except OSError:
                continue
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def end_processes(find, wait_s: float = KILL_WAIT_S) -> list[int]:
    """TERM to what `find()` returns, then KILL to what is still there `wait_s` later; returns the
    pids that needed the KILL."""
    signal_all(find(), signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not [p for p in find() if not _zombie(p)]:
            return []
        time.sleep(0.2)
    left = [p for p in find() if not _zombie(p)]
    signal_all(left, signal.SIGKILL)
    return left
