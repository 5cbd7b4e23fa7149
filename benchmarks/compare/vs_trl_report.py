"""The report of benchmarks/compare/bench_vs_trl.py: each row's time to the target held-out
accuracy, the rows against rstar2's, the table, the curve plot and the summary over seeds.

Apart from the runs so that the comparison's arithmetic is read, and tested, on its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

ROWS = ("rstar2", "rstar2_k1", "trl_sandbox", "trl_subprocess", "trl_async")
TARGET = 0.9                 # the held-out accuracy a row's time is measured to


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """Time to TARGET held-out accuracy (None if not reached), final accuracy, mean step split."""
    hit = next((p for p in row["heldout"] if p["accuracy"] >= TARGET), None)
    steps = row["steps"][1:] or row["steps"]     # the first step includes warm-up
    mean = {k: sum(st[k] for st in steps) / max(1, len(steps))
            for k in ("step_seconds", "generation", "tools", "reward", "update")}
    for k in ("train", "trainer_idle_frac", "engine_idle_frac"):
        vals = [st[k] for st in steps if st.get(k) is not None]
        if vals:
            mean[k] = sum(vals) / len(vals)
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
    """Each row against rstar2 (synchronous): speed-up = the row's time to target / rstar2's."""
    base = rows["rstar2"]
    sb = summarize(base)
    out: dict[str, Any] = {}
    budget = sb["seconds_to_target"] or sb["train_seconds"]
    for name, row in rows.items():
        if "unavailable" in row or "failed" in row:
            continue
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

    cmp = result.get("comparison", {})
    t = Table(
        title=f"rstar2 vs TRL GRPOTrainer, toy task, seed {result['config']['seed']} "
        f"({result['config']['prompts_per_step']} prompts x {result['config']['group_size']} rollouts/step, "
        f"AdamW weight decay {result['options']['weight_decay']} on every row, "
        f"target {TARGET:.0%} held-out)"
    )
    for col in ("row", "generation", "held-out start -> end", "time to target", "row time / rstar2's",
                "acc @ rstar2 budget", "step s (gen / tools / reward / update)", "k=1: train s, trainer / engine idle",
                "steps"):
        t.add_column(col, justify="left" if col in ("row", "generation") else "right")
    for name in ROWS:
        r = result["rows"].get(name)
        if r is None:
            continue
        if name not in cmp:
            why = r.get("unavailable") or r.get("failed") or "rstar2 row missing: no comparison"
            t.add_row(name, f"could not run: {why}", *[""] * 7)
            continue
        c = cmp[name]
        m = c["mean_step"]
        idle = (f"{m['train']:.1f}, {m['trainer_idle_frac']:.0%} / {m['engine_idle_frac']:.0%}"
                if "trainer_idle_frac" in m else "")
        tt = f"{c['seconds_to_target'] / 60:.2f} min" if c["seconds_to_target"] else "not reached"
        sp = "1.00x" if name == "rstar2" else (
            "n/a" if c["speedup_to_target"] is None else
            f"{'>= ' if c['speedup_is_lower_bound'] else ''}{c['speedup_to_target']:.2f}x")
        t.add_row(
            name,
            r["generation_backend"].split(" (")[0],
            f"{c['start_accuracy']:.0%} -> {c['final_accuracy']:.0%}",
            tt,
            sp,
            f"{c['accuracy_at_rstar2_budget']:.0%}",
            f"{m['step_seconds']:.1f} ({m['generation']:.1f} / {m['tools']:.2f} / {m['reward']:.2f} / "
            f"{m['update']:.1f})",
            idle,
            str(c["steps_run"]),
        )
    Console(width=max(160, Console().width)).print(t)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in ROWS:
        if "heldout" in result["rows"].get(name, {}):
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


def seed_summary(per_seed: dict[str, dict]) -> dict[str, Any]:
    """Per row: each seed's time to target and its ratio to rstar2's (row time / rstar2 time)."""
    out: dict[str, Any] = {}
    for seed, res in per_seed.items():
        for name, c in res.get("comparison", {}).items():
            if name.startswith("_"):
                continue
            out.setdefault(name, {})[seed] = {"seconds_to_target": c["seconds_to_target"],
                                              "ratio_to_rstar2": 1.0 if name == "rstar2" else c["speedup_to_target"],
                                              "lower_bound": c.get("speedup_is_lower_bound", False),
                                              "mean_step_seconds": c["mean_step"]["step_seconds"]}
        for name, r in res["rows"].items():
            if "unavailable" in r or "failed" in r:
                out.setdefault(name, {})[seed] = {"could_not_run": r.get("unavailable") or r.get("failed")}
    return out


def print_seed_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    seeds = sorted({seed for per in summary.values() for seed in per}, key=int)
    t = Table(title=f"time to {TARGET:.0%} held-out per seed, and row time / rstar2's (>= 1: rstar2 faster)")
    t.add_column("row")
    for seed in seeds:
        t.add_column(f"seed {seed}", justify="right")
    for name in ROWS:
        if name not in summary:
            continue
        cells = []
        for seed in seeds:
            c = summary[name].get(seed)
            if c is None:
                cells.append("")
            elif "could_not_run" in c:
                cells.append(f"could not run: {c['could_not_run'][:70]}")
            else:
                tt = f"{c['seconds_to_target'] / 60:.2f} min" if c["seconds_to_target"] else "not reached"
                ratio = "n/a" if c["ratio_to_rstar2"] is None else (
                    f"{'>= ' if c['lower_bound'] else ''}{c['ratio_to_rstar2']:.2f}x")
                cells.append(f"{tt}, {ratio}")
        t.add_row(name, *cells)
    Console(width=max(160, Console().width)).print(t)
