"""`srun` stand-in: one job step's tasks as local processes (slurm_standin.py says what it honours)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from slurm_standin import (FORWARDED, KILL_WAIT_S, Usage, end_processes, expand_hostnames, export_env,
                           parse_options, process_tree, signal_all)

OPTIONS = {"--overlap": False, "--export": True, "--nodes": True, "-N": True, "--ntasks": True, "-n": True,
           "--ntasks-per-node": True, "--nodelist": True, "-w": True, "--cpus-per-task": True, "-c": True,
           "--kill-on-bad-exit": False, "-K": False}


def plan_tasks(opts: dict[str, str], allocation: list[str]) -> list[str]:
    """The host of each task, in task order (block distribution, as srun's default)."""
    hosts = allocation
    if "--nodelist" in opts:
        hosts = expand_hostnames(opts["--nodelist"])
        outside = [h for h in hosts if h not in allocation]
        if outside:
            raise Usage(f"error: Requested node configuration is not available ({','.join(outside)} is not in "
                        f"the allocation {','.join(allocation)})")
    nodes = int(opts.get("--nodes", len(hosts) if "--nodelist" in opts or "--ntasks" not in opts else 1))
    if nodes > len(hosts):
        raise Usage(f"error: --nodes={nodes}: the allocation has {len(hosts)} nodes")
    hosts = hosts[:nodes]
    if "--ntasks-per-node" in opts:
        return [h for h in hosts for _ in range(int(opts["--ntasks-per-node"]))]
    ntasks = int(opts.get("--ntasks", nodes))
    per, extra = divmod(ntasks, nodes)
    return [h for i, h in enumerate(hosts) for _ in range(per + (i < extra))]


def task_env(base: dict[str, str], opts: dict[str, str], hosts: list[str], procid: int, step: int) -> dict[str, str]:
    env = export_env(opts.get("--export", "ALL"), base)
    nodes = list(dict.fromkeys(hosts))
    host = hosts[procid]
    env.update(SLURM_NODEID=str(nodes.index(host)), SLURM_PROCID=str(procid),
               SLURM_LOCALID=str(hosts[:procid].count(host)), SLURMD_NODENAME=host, SLURM_TOPOLOGY_ADDR=host,
               SLURM_STEP_NUM_NODES=str(len(nodes)), SLURM_STEP_NUM_TASKS=str(len(hosts)),
               SLURM_NTASKS=str(len(hosts)), SLURM_NPROCS=str(len(hosts)), SLURM_STEP_NODELIST=",".join(nodes),
               SLURM_STEP_ID=str(step), SLURM_STEPID=str(step),
               SLURM_CPUS_PER_TASK=opts.get("--cpus-per-task", "1"))
    return env


def main(argv: list[str]) -> int:
    try:
        opts, command = parse_options(argv, OPTIONS)
        if not command:
            raise Usage("error: no command to run")
        if "SLURM_JOB_ID" not in os.environ:
            raise Usage("error: not inside a job (SLURM_JOB_ID is not set): submit with sbatch")
        hosts = plan_tasks(opts, expand_hostnames(os.environ["SLURM_JOB_NODELIST"]))
    except Usage as e:
        print(f"srun: {e}", file=sys.stderr)
        return 1
    step = int(time.time() * 1000) % 1_000_000
    tasks = [subprocess.Popen(command, env=task_env(dict(os.environ), opts, hosts, i, step), start_new_session=True)
             for i in range(len(hosts))]
    pids = [t.pid for t in tasks]

    def forward(signum, frame):       # slurmstepd signals every process of the step (proctrack)
        signal_all(process_tree(pids), signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    kill_on_bad_exit = opts.get("--kill-on-bad-exit", "0") not in ("0",)
    codes: dict[int, int] = {}
    ending = threading.Event()
    while len(codes) < len(tasks):
        for i, task in enumerate(tasks):
            if i in codes or task.poll() is None:
                continue
            rc = task.returncode
            codes[i] = 128 - rc if rc < 0 else rc
            if codes[i]:
                what = f"Killed by signal {-rc}" if rc < 0 else f"Exited with exit code {rc}"
                print(f"srun: error: {hosts[i]}: task {i}: {what}", file=sys.stderr, flush=True)
            if codes[i] and kill_on_bad_exit and not ending.is_set():
                ending.set()
                print(f"srun: error: task {i} on {hosts[i]} failed (--kill-on-bad-exit): terminating the step",
                      file=sys.stderr, flush=True)
                rest = [t.pid for j, t in enumerate(tasks) if j not in codes]
                threading.Thread(target=end_processes, args=(lambda: process_tree(rest), KILL_WAIT_S),
                                 daemon=True).start()
        time.sleep(0.1)
    return max(codes.values())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
