"""`sbatch` and `scontrol` stand-ins, and the detached process that runs one job (with its requeues).

slurm_standin.py says what they honour. `job_state(id)` is what a test reads back.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from slurm_standin import (JOB_MARKER, TERMINAL, Usage, end_processes, expand_hostnames, export_env, job_dir,
                           marked_processes, parse_options, process_tree, read, spool, write)

SBATCH_OPTIONS = {name: True for name in (
    "--export", "--dependency", "-d", "--nodes", "-N", "--output", "-o", "--open-mode", "--job-name", "-J",
    "--time", "-t", "--signal", "--ntasks-per-node", "--gpus-per-node", "--chdir", "-D")}
SBATCH_OPTIONS.update({"--exclusive": False, "--requeue": False, "--parsable": False})


def sbatch_directives(script: str) -> list[str]:
    """The options of the script's #SBATCH lines (those before its first command)."""
    out = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            out.extend(line[len("#SBATCH"):].split())
        elif line.strip() and not line.startswith("#"):
            break
    return out


def next_job_id(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "next_id.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        n = int(read(root / "next_id", "1000")) + 1
        write(root / "next_id", str(n))
    return str(n)


def sbatch(argv: list[str]) -> int:
    try:
        cli, rest = parse_options(argv, SBATCH_OPTIONS)
        if not rest:
            raise Usage("error: no batch script given")
        script = Path(rest[0])
        text = script.read_text()
        opts, _ = parse_options(sbatch_directives(text), SBATCH_OPTIONS)
        opts.update(cli)
        nodes = [h for h in os.environ.get("RSTAR2_STANDIN_NODES", "").split(",") if h]
        want = int(opts.get("--nodes", "1"))
        if want > len(nodes):
            raise Usage(f"error: Batch job submission failed: --nodes={want}, but RSTAR2_STANDIN_NODES has "
                        f"{len(nodes)} hosts ({','.join(nodes) or 'none'})")
        for dep in filter(None, opts.get("--dependency", "").split(",")):
            kind, _, ids = dep.partition(":")
            if kind != "afterok" or not ids:
                raise Usage(f"error: --dependency={dep}: this stand-in knows afterok:ID[:ID]")
    except (Usage, OSError) as e:
        print(f"sbatch: {e}", file=sys.stderr)
        return 1
    root = spool()
    job_id = next_job_id(root)
    jdir = job_dir(job_id, root)
    jdir.mkdir(parents=True)
    shutil.copy(script, jdir / "script")            # SLURM keeps the script as submitted
    (jdir / "script").chmod(0o755)
    env = export_env(opts.get("--export", "ALL"), dict(os.environ))
    cpus = os.environ.get("RSTAR2_STANDIN_CPUS", str(os.cpu_count()))
    name = opts.get("--job-name", script.name)
    env.update(SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NAME=name, SLURM_JOB_NUM_NODES=str(want),
               SLURM_NNODES=str(want), SLURM_JOB_NODELIST=",".join(nodes[:want]),
               SLURM_NODELIST=",".join(nodes[:want]), SLURM_CPUS_ON_NODE=cpus, SLURM_SUBMIT_DIR=os.getcwd(),
               SLURM_NODEID="0", SLURMD_NODENAME=nodes[0], RSTAR2_STANDIN_SPOOL=str(root),
               **{JOB_MARKER: f"{root}:{job_id}"})
    write(jdir / "job.json", json.dumps({"options": opts, "args": rest[1:], "env": env,
                                         "cwd": opts.get("--chdir", os.getcwd())}))
    write(jdir / "state", "PENDING")
    subprocess.Popen([sys.executable, "-m", "standin_jobs", "run-job", str(root), job_id],
                     cwd=Path(__file__).parent, start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=open(jdir / "controller.log", "a"), stderr=subprocess.STDOUT)
    print(job_id if "--parsable" in opts else f"Submitted batch job {job_id}", flush=True)
    return 0


def _dependencies_ok(root: Path, opts: dict[str, str]) -> bool:
    ids = [i for dep in filter(None, opts.get("--dependency", "").split(",")) for i in dep.split(":")[1:]]
    while True:
        states = [read(job_dir(i, root) / "state", "UNKNOWN") for i in ids]
        if all(s == "COMPLETED" for s in states):
            return True
        if any(s in ("FAILED", "CANCELLED", "UNKNOWN") for s in states):
            return False
        time.sleep(0.5)


def run_job(root: Path, job_id: str) -> None:
    """Wait for the dependencies, run the batch script, end what it left, requeue if asked."""
    jdir = job_dir(job_id, root)
    job = json.loads((jdir / "job.json").read_text())
    opts = job["options"]
    if not _dependencies_ok(root, opts):
        write(jdir / "reason", "DependencyNeverSatisfied")
        write(jdir / "state", "CANCELLED")
        return
    restarts = 0
    write(jdir / "started", str(time.time()))
    while True:
        env = dict(job["env"], SLURM_RESTART_COUNT=str(restarts))
        out = opts.get("--output", "slurm-%j.out").replace("%j", job_id).replace("%x", env["SLURM_JOB_NAME"])
        mode = "a" if opts.get("--open-mode") == "append" else "w"
        write(jdir / "state", "RUNNING")
        with open(Path(job["cwd"], out), mode) as log:
            shell = subprocess.Popen([str(jdir / "script"), *job["args"]], env=env, cwd=job["cwd"],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
            write(jdir / "batch.pid", str(shell.pid))
            rc = shell.wait()
        marker = env[JOB_MARKER]
        killed = end_processes(lambda: marked_processes(marker) + process_tree([shell.pid]))
        with open(jdir / "cleanup.log", "a") as f:
            f.write(json.dumps({"restart": restarts, "batch_rc": rc, "killed_after_wait": killed}) + "\n")
        if (jdir / "requeue").exists():
            (jdir / "requeue").unlink()
            restarts += 1
            write(jdir / "restarts", str(restarts))
            write(jdir / "state", "PENDING")
            continue
        write(jdir / "exit_code", str(rc if rc >= 0 else 128 - rc))
        write(jdir / "ended", str(time.time()))
        write(jdir / "state", "COMPLETED" if rc == 0 else "FAILED")
        return


def job_state(job_id: str, root: Path | None = None) -> dict:
    jdir = job_dir(job_id, root)
    code, started, ended = (read(jdir / name) for name in ("exit_code", "started", "ended"))
    return {"JobId": job_id, "JobState": read(jdir / "state", "UNKNOWN"), "Reason": read(jdir / "reason", "None"),
            "ExitCode": int(code) if code else None, "Restarts": int(read(jdir / "restarts", "0")),
            "RunSeconds": float(ended) - float(started) if started and ended else None}


def scontrol(argv: list[str]) -> int:
    try:
        if argv[:2] == ["show", "hostnames"] and len(argv) <= 3:
            nodelist = argv[2] if len(argv) == 3 else os.environ.get("SLURM_JOB_NODELIST", "")
            print("\n".join(expand_hostnames(nodelist)))
            return 0
        if len(argv) == 2 and argv[0] == "requeue":
            jdir = job_dir(argv[1])
            if read(jdir / "state") != "RUNNING":
                raise Usage(f"error: Requested operation is presently disabled for job {argv[1]}")
            write(jdir / "requeue", "1")
            return 0
        if len(argv) == 3 and argv[:2] == ["show", "job"]:
            state = job_state(argv[2])
            state.pop("RunSeconds")
            print(" ".join(f"{k}={v if k != 'ExitCode' else f'{v}:0'}" for k, v in state.items()))
            return 0
        raise Usage(f"error: this stand-in knows `show hostnames LIST`, `requeue ID`, `show job ID` (got {argv})")
    except Usage as e:
        print(f"scontrol: {e}", file=sys.stderr)
        return 1


def wait_for(job_id: str, root: Path, timeout_s: float) -> dict:
    """A test's wait: the job's state once terminal (TimeoutError naming the job otherwise)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = job_state(job_id, root)
        if state["JobState"] in TERMINAL:
            return state
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} not finished after {timeout_s:.0f} s: {job_state(job_id, root)}")


if __name__ == "__main__" and sys.argv[1:2] == ["run-job"]:
    run_job(Path(sys.argv[2]), sys.argv[3])
