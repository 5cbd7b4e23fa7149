"""The SLURM stand-ins behave as SLURM does where the template and the rehearsal rely on it: the
allocation's variables, --export, -w, --kill-on-bad-exit with srun's line naming the host, signals
to every process of a step, afterok chains, requeue under the same id, and nothing left at job end."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from slurm_standin import expand_hostnames, marked_processes
from standin_jobs import job_dir, wait_for

BIN = Path(__file__).resolve().parent / "bin"
NODES = "127.0.0.2,127.0.0.3"


@pytest.fixture
def cluster(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RSTAR2_STANDIN_SPOOL": str(tmp_path / "spool"),
           "RSTAR2_STANDIN_NODES": NODES, "RSTAR2_STANDIN_CPUS": "3"}

    def submit(body: str, *options: str) -> str:
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\n#SBATCH --nodes=8\n#SBATCH --output=out-%j.txt\n#SBATCH --open-mode=append\n"
                          "set -euo pipefail\n" + body)
        out = subprocess.run(["sbatch", "--parsable", *options, str(script)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def finish(job: str) -> tuple[dict, str]:
        state = wait_for(job, tmp_path / "spool", 60)
        return state, (tmp_path / f"out-{job}.txt").read_text()

    return submit, finish, tmp_path


def test_hostnames_expand_as_scontrol_does():
    assert expand_hostnames("n[01-03,7],m1") == ["n01", "n02", "n03", "n7", "m1"]
    assert expand_hostnames(NODES) == ["127.0.0.2", "127.0.0.3"]


def test_steps_get_the_allocations_variables_export_and_placement(cluster):
    submit, finish, _ = cluster
    job = submit('echo "batch $SLURM_JOB_NUM_NODES $SLURM_JOB_NODELIST $SLURM_CPUS_ON_NODE X=$X"\n'
                 'srun --overlap --export=ALL,Y=7 --nodes=2 --ntasks-per-node=1 --cpus-per-task=3 '
                 'bash -c \'echo "task $SLURM_PROCID node $SLURM_NODEID $SLURMD_NODENAME Y=$Y job $SLURM_JOB_ID"\'\n'
                 'srun --nodes=1 --ntasks=1 -w 127.0.0.3 bash -c \'echo "alone on $SLURMD_NODENAME"\'\n',
                 "--nodes=2", "--export=ALL,X=5")
    state, out = finish(job)
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", 0), out
    assert f"batch 2 {NODES} 3 X=5" in out
    assert f"task 0 node 0 127.0.0.2 Y=7 job {job}" in out and f"task 1 node 1 127.0.0.3 Y=7 job {job}" in out
    assert "alone on 127.0.0.3" in out


def test_a_bad_task_ends_the_step_with_a_line_naming_its_host(cluster):
    submit, finish, _ = cluster
    job = submit("srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 "
                 "bash -c 'if [[ $SLURM_NODEID == 1 ]]; then exit 3; fi; sleep 60'\n", "--nodes=2")
    t = time.monotonic()
    state, out = finish(job)
    assert time.monotonic() - t < 30
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", 143), out     # the highest: 128 + SIGTERM
    assert "srun: error: 127.0.0.3: task 1: Exited with exit code 3" in out


def test_a_signal_to_srun_reaches_every_process_of_its_tasks(cluster):
    submit, finish, tmp_path = cluster
    # each task and a child of it trap USR1; the batch shell forwards its USR1 to srun, as the template does
    job = submit("srun --nodes=2 --ntasks-per-node=1 bash -c '"
                 "trap \"echo child-$SLURM_NODEID; exit 0\" USR1; (trap \"echo grandchild-$SLURM_NODEID; exit 0\" USR1;"
                 " sleep 60 & wait) & wait' &\n"
                 "pid=$!\ntrap 'kill -USR1 $pid' USR1\nwhile kill -0 $pid 2>/dev/null; do wait $pid || true; done\n",
                 "--nodes=2")
    pid_file = job_dir(job, tmp_path / "spool") / "batch.pid"
    deadline = time.monotonic() + 30
    while not pid_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)
    os.kill(int(pid_file.read_text()), signal.SIGUSR1)
    state, out = finish(job)
    for name in ("child-0", "child-1", "grandchild-0", "grandchild-1"):
        assert name in out, out


def test_afterok_chains_requeue_keeps_the_id_and_job_end_leaves_nothing(cluster):
    submit, finish, tmp_path = cluster
    first = submit('echo "run $SLURM_RESTART_COUNT"\nsrun --nodes=1 --ntasks=1 sleep 300 &\nsleep 0.5\n'
                   'if [[ $SLURM_RESTART_COUNT == 0 ]]; then scontrol requeue "$SLURM_JOB_ID"; fi\n', "--nodes=2")
    second = submit("echo second\nexit 4\n", "--nodes=2", f"--dependency=afterok:{first}")
    never = submit("echo never\n", "--nodes=2", f"--dependency=afterok:{second}")
    state, out = finish(first)
    assert (state["JobState"], state["ExitCode"], state["Restarts"]) == ("COMPLETED", 0, 1)
    assert out.splitlines()[:1] + [ln for ln in out.splitlines() if ln.startswith("run")][1:] == ["run 0", "run 1"]
    assert marked_processes(f"{tmp_path / 'spool'}:{first}") == []        # the background `sleep 300` step
    state, _ = finish(second)
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", 4)
    state = wait_for(never, tmp_path / "spool", 30)
    assert (state["JobState"], state["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied")
