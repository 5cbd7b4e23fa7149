"""`rstar2 eval all CKPT`: the paper's table from one checkpoint, as markdown and JSON.

Row order: the paper's math table (AIME24, AIME25, HMMT25; MATH-500 after them), then its
generalization table (GPQA-Diamond for science, BFCL v3 for tool use, IFEval and Arena-Hard
for alignment). Each row gives the benchmark's headline score, avg@k with its spread, the mean
response tokens, the tool-call rate (samples with at least one call) and which reference
produced the number. A row that is not run says why (`benchmarks.LEFT_OUT`). With a second
checkpoint (`--compare CKPT2`) each row also gets B's avg@k and A - B with its 95 % interval
(eval/compare.py says how it is computed).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from rstar2_cli.eval.benchmarks import LEFT_OUT
from rstar2_cli.eval.compare import METHOD, paired_difference, per_question

ROWS = (("aime24", "AIME24"), ("aime25", "AIME25"), ("hmmt25", "HMMT25"), ("math500", "MATH-500"),
        ("gpqa_diamond", "GPQA-Diamond"), ("bfcl", "BFCL v3 (AST: simple, multiple, parallel)"),
        ("ifeval", "IFEval (strict prompt)"), ("arena_hard", "Arena-Hard"))
MATH_REFERENCE = "rstar2 RL grader (math-verify)"     # the math sets and custom --data sets
REFERENCE = {
    "gpqa_diamond": "lm-eval GPQA flexible-extract (MultiChoiceRegexFilter)",
    "bfcl": "bfcl-eval ast_checker", "ifeval": "lm-eval IFEval checkers",
}
MD_FILE, JSON_FILE = "paper_table.md", "paper_table.json"


def headline(results: dict[str, Any]) -> float:
    """The number the paper reports for a benchmark: BFCL's mean category accuracy, IFEval's
    prompt-level strict accuracy, avg@k pass@1 elsewhere."""
    m = results["metrics"]
    if "bfcl" in m:
        return m["bfcl"]["overall"]
    if "ifeval" in m:
        return m["ifeval"]["prompt_level_strict_acc"]
    return m[f"avg@{m['samples_per_problem']}"]


def table_row(bench: str, label: str, res: dict[str, Any] | None, other: dict[str, Any] | None = None) -> dict[str, Any]:
    if res is None:
        return {"benchmark": bench, "label": label, "run": False, "reason": LEFT_OUT.get(bench, "not run")}
    m, k = res["metrics"], res["metrics"]["samples_per_problem"]
    row = {"benchmark": bench, "label": label, "run": True, "score": headline(res), "k": k,
           "avg@k": m[f"avg@{k}"], "avg@k_std": m[f"avg@{k}_std"], "problems": m["problems"],
           "response_tokens": m["response_tokens"]["mean"], "tool_call_rate": m["tool_call_rate"],
           "reference": REFERENCE.get(bench, MATH_REFERENCE), "reference_versions": res.get("reference")}
    if other is not None:
        row["compare"] = paired_difference(per_question(res), per_question(other))
    return row


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(rows: list[dict[str, Any]], model: str, compare_model: str | None = None) -> str:
    head = ["benchmark", "score", "avg@k ± std", "k", "response tokens", "tool-call rate", "reference"]
    if compare_model:
        head += ["B avg@k", "A − B", "95 % interval"]
    lines = [f"# rstar2 eval all: {model}" + (f" (A) vs {compare_model} (B)" if compare_model else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r["run"]:
            cells = [r["label"], "—", "—", "—", "—", "—", f"left out: {r['reason']}"] + (["—"] * 3 if compare_model else [])
        else:
            cells = [r["label"], _pct(r["score"]), f"{_pct(r['avg@k'])} ± {_pct(r['avg@k_std'])}", str(r["k"]),
                     f"{r['response_tokens']:.0f}", _pct(r["tool_call_rate"]), r["reference"]]
            if compare_model:
                c = r["compare"]
                cells += [_pct(c["b"]), f"{100 * c['diff']:+.1f}", f"[{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}]"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Scores in %. score: BFCL's mean category accuracy, IFEval's prompt-level strict "
              "accuracy, avg@k pass@1 elsewhere. tool-call rate: samples with at least one tool call."]
    if compare_model:
        lines.append(f"A − B: {METHOD}, per-question solved fractions.")
    return "\n".join(lines) + "\n"


def run_table(run_one: Callable[[str, str, Path], dict[str, Any]], model: str, out_dir: Path,
              benchmarks: Sequence[str], compare_model: str | None = None, with_left_out: bool = True) -> dict[str, Any]:
    """Run every benchmark in `benchmarks` for `model` (and `compare_model`), then write
    paper_table.md and paper_table.json under `out_dir`, rows in the paper's order (names it does
    not list, e.g. a custom `--data` set, after them). `run_one(bench, model, out)` evaluates one
    benchmark into folder `out` and returns its results dict. `with_left_out`: list the paper rows
    that are not run, with the reason."""
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = dict(ROWS)
    order = [b for b in labels if b in benchmarks] + [b for b in benchmarks if b not in labels]
    # all of A, then all of B: one checkpoint is loaded at a time
    runs = {(side, b): run_one(b, ckpt, out_dir / side / b)
            for side, ckpt in (("A", model), ("B", compare_model)) if ckpt for b in order}
    shown = [b for b in labels if b in benchmarks or (with_left_out and b in LEFT_OUT)]
    shown += [b for b in order if b not in labels]
    rows = [table_row(b, labels.get(b, b), runs[("A", b)], runs.get(("B", b))) if b in order
            else table_row(b, labels[b], None) for b in shown]
    table = {"model": model, "compare_model": compare_model, "rows": rows}
    (out_dir / JSON_FILE).write_text(json.dumps(table, indent=2))
    (out_dir / MD_FILE).write_text(markdown(rows, model, compare_model))
    return table


def default_table_dir(benchmark: str, model: str, out: str | None) -> Path:
    return Path(out) if out else Path("runs") / "eval" / f"{benchmark}-{Path(model.rstrip('/')).name}"


def evaluate_table(settings_for: Callable[[str, str, str], Any], model: str, out_dir: Path,
                   benchmarks: Sequence[str], compare_model: str | None = None,
                   with_left_out: bool = True) -> dict[str, Any]:
    """`run_table` with `run_eval` on `settings_for(bench, ckpt, out)` (EvalSettings), loading
    each checkpoint's engine once for all its benchmarks."""
    from rstar2_cli.eval.runner import EngineReuse, run_eval

    engines = EngineReuse()

    def run_one(bench: str, ckpt: str, out: Path) -> dict[str, Any]:
        s = settings_for(bench, ckpt, str(out))
        return run_eval(s, engine=engines.get(s))

    try:
        return run_table(run_one, model, out_dir, benchmarks, compare_model, with_left_out)
    finally:
        engines.close()
