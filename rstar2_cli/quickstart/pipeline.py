"""`rstar2 quickstart`: the real pipeline (prepare -> sft -> rl -> eval) on a toy task, on CPU.

Why the same core functions as the CLI (`run_sft`, `RLTrainer`, `run_eval`) and not shortcuts:
the quickstart is the smoke test a new user runs first; if it passes, the commands they run next
work too. Only the sizes, the toy data and the short prompt are quickstart-specific.

The held-out curve is measured during RL with `run_eval` on the trainer's own engine and sandbox
(every `eval_every` steps, right after the weight sync), so no extra engine is started; the SFT
start and the final model are evaluated the same way, which makes the first and last points of
the curve exactly `sft_accuracy` and `final_accuracy`.

`--compare-grpo` reruns RL from the same SFT checkpoint with the same seed and steps and RoC off.
"""
from __future__ import annotations

import io
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.eval.runner import TRAJ_FILE, load_done, run_eval
from rstar2_cli.eval.settings import EvalSettings
from rstar2_cli.quickstart.prepare import PreparedToy, prepare_toy
from rstar2_cli.quickstart.report import write_report
from rstar2_cli.quickstart.settings import TOY_PROTOCOL, TOY_SYSTEM_PROMPT, QuickstartSettings, toy_rl_recipe
from rstar2_cli.rl.run.run_folder import write_resolved_recipe
from rstar2_cli.rl.run.trainer import RLTrainer
from rstar2_cli.sft.settings import SftConfig
from rstar2_cli.sft.trainer import run_sft
from rstar2_cli.source_commit import source_commit

# Fig. 4's quantity is measured on the training rollouts; one step is noisy (and both methods
# reach 0 once the errors are gone), so the "final" value is the mean over the second half of RL.
FINAL_WINDOW = 0.5
# What a quickstart run writes in its --out folder (prepare_toy, sft_stage, rl_stage, write_report).
# A rerun would add to them: its RL steps to the old metrics.jsonl, its checkpoints beside the old
# ones, and its held-out evals would resume the old model's trajectories. The quickstart owns these
# names and removes them before it starts; anything else in the folder stays.
OWN_FOLDERS = ("data", "model_init", "sft")
OWN_RL_FOLDERS = ("rl_roc*", "rl_grpo*")
OWN_FILES = ("settings.json", "report.json", "report.md", "report.png")


@dataclass
class RlRun:
    """One RL run's curves: per-step training metrics and held-out points (step, metrics)."""
    label: str
    steps: list[dict[str, float]] = field(default_factory=list)
    heldout: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    checkpoint: str = ""
    seconds: float = 0.0

    def final_tool_error_ratio_positive(self, window: float = FINAL_WINDOW) -> float:
        """Mean per-step ratio over the last `window` fraction of steps (1.0: the whole run)."""
        k = max(1, round(len(self.steps) * window))
        tail = [m.get("rollout/tool_error_ratio_positive", 0.0) for m in self.steps[-k:]]
        return sum(tail) / len(tail) if tail else 0.0

    def summary(self) -> dict[str, Any]:
        first, last = self.heldout[0][1], self.heldout[-1][1]
        return {"start_accuracy": first["accuracy"], "final_accuracy": last["accuracy"],
                "tool_error_ratio_positive": self.final_tool_error_ratio_positive(),
                "tool_error_ratio_positive_all_steps": self.final_tool_error_ratio_positive(1.0),
                "heldout_tool_error_ratio_positive": last["tool_error_ratio_positive"],
                "final_reward_mean": self.steps[-1].get("rollout/reward_mean", 0.0) if self.steps else 0.0,
                "checkpoint": self.checkpoint, "seconds": round(self.seconds, 1),
                # the curves, so that a multi-seed summary can be drawn from report.json alone
                "tool_error_ratio_positive_curve": [m.get("rollout/tool_error_ratio_positive", 0.0)
                                                    for m in self.steps],
                "heldout_accuracy_curve": [[step, m["accuracy"]] for step, m in self.heldout]}


def sft_stage(s: QuickstartSettings, prep: PreparedToy, progress: bool) -> str:
    cfg = SftConfig(name="quickstart-sft", model=str(prep.model_dir), data=[str(prep.sft_file)],
                    out_dir=str(s.out / "sft"), max_steps=s.sft_steps, lr=s.sft_lr, warmup_ratio=0.05,
                    lr_scheduler="cosine", batch_size=s.sft_batch_size, per_device_batch_size=s.sft_batch_size,
                    max_length=512, gradient_checkpointing=False, dtype="float32", seed=s.seed,
                    logging_steps=10, save_steps=1_000_000, force_reason=TOY_PROTOCOL["force_reason"])
    return run_sft(cfg, progress=progress)["final_checkpoint"]


def heldout_eval(s: QuickstartSettings, prep: PreparedToy, model: str, out_dir: Path, *, tokenizer: str,
                 engine=None, tools=None, progress: bool = False) -> dict[str, Any]:
    """`run_eval` on the held-out set with the toy prompt; returns the numbers the report plots.

    With `engine` given, `model` only names the run in results.json."""
    settings = EvalSettings(benchmark="toy-heldout", model=model, data=str(prep.heldout_file), out_dir=str(out_dir),
                            tokenizer=tokenizer, samples=s.eval_samples, temperature=s.eval_temperature, top_p=1.0,
                            max_tokens=s.max_response_tokens, max_turns=s.max_turns, seed=s.seed,
                            max_model_len=512, progress=progress, system_prompt=TOY_SYSTEM_PROMPT,
                            tools_in_prompt=False, protocol=TOY_PROTOCOL)
    quiet = Console(file=io.StringIO())   # the quickstart prints its own table at the end
    results = run_eval(settings, engine=engine, tools=tools, console=quiet)
    records = list(load_done(out_dir / TRAJ_FILE).values())
    pos = [r for r in records if r["reward"] > 0]
    pos_calls = sum(r["tool_calls"] for r in pos)
    m = results["metrics"]
    return {"accuracy": m[f"avg@{m['samples_per_problem']}"],
            "tool_error_ratio_positive": sum(r["tool_errors"] for r in pos) / pos_calls if pos_calls else 0.0,
            "tool_use_rate": sum(r["tool_calls"] > 0 for r in records) / max(1, len(records)),
            "response_tokens": m["response_tokens"]["mean"]}


def rl_stage(s: QuickstartSettings, prep: PreparedToy, sft_model: str, *, roc: bool, progress: bool) -> RlRun:
    """One RL run through `RLTrainer.train()`, with held-out points taken from its `on_step` hook."""
    label = "roc" if roc else "grpo"
    out = s.out / (f"rl_{label}" + (f"_k{s.max_staleness}" if s.max_staleness else "")
                   + ("_partial" if s.partial_rollout else ""))
    cfg = load_recipe_dict(toy_rl_recipe(s, sft_model, prep.train_file, out, roc=roc),
                           source=f"quickstart {label} recipe")
    write_resolved_recipe(cfg)            # what `rstar2 rl <it> --resume auto` continues
    run = RlRun(label)
    trainer: RLTrainer | None = None

    def point(step: int) -> None:
        assert trainer is not None
        res = heldout_eval(s, prep, f"{label}@step{step}", out / "heldout" / f"step_{step:04d}",
                           tokenizer=sft_model, engine=trainer.side.fleet.engines[0], tools=trainer.side.tools)
        run.heldout.append((step, res))
        (out / "heldout_curve.json").write_text(json.dumps(run.heldout, indent=1))

    def on_step(step: int, metrics: dict) -> None:
        run.steps.append(dict(metrics))
        if step % s.eval_every == 0 or step == cfg.train.steps:
            point(step)

    started = time.perf_counter()
    trainer = RLTrainer(cfg, progress=progress, on_step=on_step)
    try:
        point(0)                               # the SFT start, on the same engine
    except BaseException:
        trainer.close()                        # train() closes it otherwise
        raise
    run.checkpoint = str(trainer.train())
    run.seconds = time.perf_counter() - started
    return run


def clear_previous_run(out: Path) -> list[str]:
    """Remove what an earlier quickstart run left in `out` (OWN_FOLDERS, OWN_RL_FOLDERS, OWN_FILES);
    the names removed, in that order."""
    found = [out / name for name in OWN_FOLDERS] + sorted(p for pattern in OWN_RL_FOLDERS for p in out.glob(pattern))
    removed = []
    for path in found + [out / name for name in OWN_FILES]:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_file() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(path.name)
    return removed


def run_quickstart(s: QuickstartSettings, *, progress: bool = True) -> dict[str, Any]:
    """Run the whole quickstart; writes report.json, report.md and report.png under s.out_dir,
    after removing an earlier run's files there (`clear_previous_run`)."""
    removed = clear_previous_run(s.out) if s.out.is_dir() else []
    if removed:
        Console().print(f"quickstart: {s.out} held an earlier run; removed its {', '.join(removed)} "
                                   f"and starting clean (the quickstart owns these)", soft_wrap=True, highlight=False)
    s.out.mkdir(parents=True, exist_ok=True)
    (s.out / "settings.json").write_text(s.model_dump_json(indent=2))
    started = time.perf_counter()
    timings: dict[str, float] = {}
    stages = 4 + s.compare_grpo
    banner = Console(stderr=True).rule if progress else (lambda text: None)
    banner(f"quickstart 1/{stages}: the toy task, {s.n_train} training and {s.n_heldout} held-out problems "
           f"(seed {s.seed})")
    t = time.perf_counter()
    prep = prepare_toy(s, s.out)
    timings["prepare"] = time.perf_counter() - t
    banner(f"quickstart 2/{stages}: non-reasoning SFT, {s.sft_steps} steps")
    t = time.perf_counter()
    sft_model = sft_stage(s, prep, progress)
    timings["sft"] = time.perf_counter() - t
    banner(f"quickstart 3/{stages}: RL with GRPO-RoC, {s.rl_steps} steps, a held-out point every {s.eval_every}")
    roc_run = rl_stage(s, prep, sft_model, roc=True, progress=progress)
    timings["rl_roc"] = roc_run.seconds
    minutes = (time.perf_counter() - started) / 60
    runs = [roc_run]
    if s.compare_grpo:
        banner(f"quickstart 4/{stages}: plain GRPO (RoC off) from the same SFT start, {s.rl_steps} steps")
        grpo_run = rl_stage(s, prep, sft_model, roc=False, progress=progress)
        timings["rl_grpo"] = grpo_run.seconds
        runs.append(grpo_run)
    banner(f"quickstart {stages}/{stages}: the report")
    report = build_report(s, runs, timings, prep.behaviours, minutes=minutes,
                          total_minutes=(time.perf_counter() - started) / 60)
    write_report(s.out, report, runs)
    return report


def build_report(s: QuickstartSettings, runs: list[RlRun], timings: dict[str, float], behaviours: dict[str, int],
                 *, minutes: float, total_minutes: float) -> dict[str, Any]:
    """report.json's numbers from the RL runs (RoC first, then GRPO with --compare-grpo)."""
    roc_run = runs[0]
    report: dict[str, Any] = {
        "seed": s.seed, "preset": s.preset, "commit": source_commit(),
        "sft_accuracy": roc_run.heldout[0][1]["accuracy"],
        "final_accuracy": roc_run.heldout[-1][1]["accuracy"],
        "minutes": round(minutes, 2),
        "total_minutes": round(total_minutes, 2),
        "timings_seconds": {k: round(v, 1) for k, v in timings.items()},
        "sft_behaviours": behaviours,
        "heldout_problems": s.n_heldout, "heldout_samples": s.eval_samples,
    }
    report["improvement_points"] = round(100 * (report["final_accuracy"] - report["sft_accuracy"]), 1)
    for r in runs:
        report[r.label] = r.summary()
    return report

