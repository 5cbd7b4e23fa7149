"""`rstar2 eval all CKPT`: the paper's table from one checkpoint, as markdown and JSON.

Row order: the paper's math table (AIME24, AIME25, HMMT25; MATH-500 after them), then its
generalization table (GPQA-Diamond for science, BFCL v3 for tool use, IFEval and Arena-Hard
for alignment). Each row gives the benchmark's headline score, avg@k with its spread, the mean
response tokens, the tool-call rate (samples with at least one call) and which reference
produced the number. A row that is not run says why: left out (`benchmarks.LEFT_OUT`), or
"no data: how to add it" when its set is not on this machine (`eval all` runs the rest). GPQA's
row also gives rstar2's boxed-first score (`gpqa_boxed`) and BFCL's its per-category accuracies,
beside the reference's number. With a second
checkpoint (`--compare CKPT2`) each row also gets B's avg@k and A - B with its 95 % interval
(eval/compare.py says how it is computed).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from rstar2_cli.data.problems import DataError
from rstar2_cli.eval import runner
from rstar2_cli.eval.benchmarks import LEFT_OUT
from rstar2_cli.eval.bfcl import ABSENT as BFCL_ABSENT
from rstar2_cli.eval.bfcl import CATEGORIES as BFCL_CATEGORIES
from rstar2_cli.eval.family import how_to_add
from rstar2_cli.eval.compare import METHOD, paired_difference, per_question
from rstar2_cli.eval.report import engines_line

ROWS = (("aime24", "AIME24"), ("aime25", "AIME25"), ("hmmt25", "HMMT25"), ("math500", "MATH-500"),
        ("gpqa_diamond", "GPQA-Diamond"), ("bfcl", "BFCL v3 non-live AST"),
        ("ifeval", "IFEval (strict prompt)"), ("arena_hard", "Arena-Hard"))
MATH_REFERENCE = "rstar2 RL grader (math-verify)"     # the math sets and custom --data sets
REFERENCE = {
    "gpqa_diamond": "lm-eval GPQA flexible-extract over the final turn, exact_match",
    "bfcl": "bfcl-eval non-live AST summary (QwenFCHandler, ast_checker)", "ifeval": "lm-eval IFEval checkers",
}
MD_FILE, JSON_FILE = "paper_table.md", "paper_table.json"


def headline(results: dict[str, Any]) -> float:
    """The reference's number for a benchmark: BFCL's non-live AST summary, IFEval's prompt-level
    strict accuracy, avg@k pass@1 elsewhere (GPQA: lm-eval's flexible-extract and exact match)."""
    m = results["metrics"]
    if "bfcl" in m:
        return m["bfcl"]["non_live_ast"]
    if "ifeval" in m:
        return m["ifeval"]["prompt_level_strict_acc"]
    return m[f"avg@{m['samples_per_problem']}"]


def extra_columns(res: dict[str, Any]) -> dict[str, Any]:
    """A row's second, named scores where rstar2's variant or the reference's breakdown differs."""
    m = res["metrics"]
    if "gpqa" in m:
        return {"gpqa_boxed": m["gpqa"]["gpqa_boxed"]}
    if "bfcl" in m:
        return {"bfcl": {c: m["bfcl"][c] for c in (*BFCL_CATEGORIES, "simple")},
                "bfcl_missing": m["bfcl"]["missing"], "bfcl_absent": list(BFCL_ABSENT)}
    return {}


def table_row(bench: str, label: str, res: dict[str, Any] | None, other: dict[str, Any] | None = None,
              reason: str | None = None) -> dict[str, Any]:
    if res is None:
        why = reason or (f"left out: {LEFT_OUT[bench]}" if bench in LEFT_OUT else "not run")
        return {"benchmark": bench, "label": label, "run": False, "reason": why}
    m, k = res["metrics"], res["metrics"]["samples_per_problem"]
    row = {"benchmark": bench, "label": label, "run": True, "score": headline(res), "k": k,
           "avg@k": m[f"avg@{k}"], "avg@k_std": m[f"avg@{k}_std"], "problems": m["problems"],
           "response_tokens": m["response_tokens"]["mean"], "tool_call_rate": m["tool_call_rate"],
           "reference": REFERENCE.get(bench, MATH_REFERENCE), "reference_versions": res.get("reference"),
           **extra_columns(res)}
    if other is not None:
        row["compare"] = paired_difference(per_question(res), per_question(other))
    return row


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def markdown(rows: list[dict[str, Any]], model: str, compare_model: str | None = None,
             engines: dict[str, Any] | None = None) -> str:
    head = ["benchmark", "score", "avg@k ± std", "k", "response tokens", "tool-call rate", "reference"]
    if compare_model:
        head += ["B avg@k", "A − B", "95 % interval"]
    lines = [f"# rstar2 eval all: {model}" + (f" (A) vs {compare_model} (B)" if compare_model else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r["run"]:
            cells = [r["label"], "—", "—", "—", "—", "—", r["reason"]] + (["—"] * 3 if compare_model else [])
        else:
            cells = [r["label"], _pct(r["score"]), f"{_pct(r['avg@k'])} ± {_pct(r['avg@k_std'])}", str(r["k"]),
                     f"{r['response_tokens']:.0f}", _pct(r["tool_call_rate"]), r["reference"]]
            if compare_model:
                c = r["compare"]
                cells += [
                    _pct(c["b"]),
                    f"{100 * c['diff']:+.1f}",
                    f"[{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}]",
                ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Scores in %. score: the reference's number: lm-eval's for GPQA (flexible-extract over the "
              "whole final turn) and IFEval (prompt-level strict), bfcl-eval's non-live AST summary for BFCL, "
              "avg@k pass@1 elsewhere. tool-call rate: samples with at least one tool call."]
    if engines:
        lines.append(engines_line(engines) + ".")
    lines += notes(rows)
    if compare_model:
        lines.append(f"A − B: {METHOD}, per-question solved fractions.")
    return "\n".join(lines) + "\n"


def notes(rows: list[dict[str, Any]]) -> list[str]:
    """The second columns under the table: GPQA's boxed-first score, BFCL's categories and what BFCL
    v3 has that is absent."""
    out = []
    for r in rows:
        if r.get("run") and "gpqa_boxed" in r:
            out.append(f"GPQA-Diamond gpqa_boxed (rstar2's extraction: the final answer's last \\boxed{{}} first): "
                       f"{_pct(r['gpqa_boxed'])}")
        if r.get("run") and "bfcl" in r:
            cats = ", ".join(f"{c} {'—' if c in r['bfcl_missing'] else _pct(v)}" for c, v in r["bfcl"].items())
            missing = (
                f"; not in this run (count 0, as in BFCL's summary): {', '.join(r['bfcl_missing'])}"
                if r["bfcl_missing"]
                else ""
            )
            out.append(f"BFCL per category: {cats}{missing}. Absent from BFCL v3 here: "
                       + "; ".join(f"{k}: {v}" for k, v in BFCL_ABSENT.items()) + ".")
    return out


def run_table(run_one: Callable[[str, str, Path], dict[str, Any]], model: str, out_dir: Path,
              benchmarks: Sequence[str], compare_model: str | None = None, with_left_out: bool = True,
              no_data: dict[str, str] | None = None) -> dict[str, Any]:
    """Run every benchmark in `benchmarks` for `model` (and `compare_model`), then write
    paper_table.md and paper_table.json under `out_dir`, rows in the paper's order (names it does
    not list, e.g. a custom `--data` set, after them). `run_one(bench, model, out)` evaluates one
    benchmark into folder `out` and returns its results dict. `with_left_out`: list the paper rows
    that are not run, with the reason. `no_data`: benchmarks whose set is not here, with the
    "no data: how to add it" line their row shows; a set that fails to load (DataError) joins them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = dict(ROWS)
    no_data = dict(no_data or {})
    order = [b for b in labels if b in benchmarks] + [b for b in benchmarks if b not in labels]
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    # all of A, then all of B: one checkpoint is loaded at a time
    for side, ckpt in (("A", model), ("B", compare_model)):
        for b in order:
            if not ckpt or b in no_data:
                continue
            try:
                runs[(side, b)] = run_one(b, ckpt, out_dir / side / b)
            except DataError as e:      # the set could not be read after all: listed, not fatal
                hint = how_to_add(b)
                no_data[b] = f"no data: {e}" + ("" if hint in str(e) else f"; {hint}")
    shown = [b for b in labels if b in benchmarks or (with_left_out and b in LEFT_OUT)]
    shown += [b for b in order if b not in labels]
    rows = [table_row(b, labels.get(b, b), runs[("A", b)], runs.get(("B", b)))
            if ("A", b) in runs and (not compare_model or ("B", b) in runs)
            else table_row(b, labels.get(b, b), None, reason=no_data.get(b)) for b in shown]
    engines = next((r["engines"] for (side, _), r in runs.items() if side == "A" and "engines" in r), None)
    table = {"model": model, "compare_model": compare_model, "engines": engines, "rows": rows}
    (out_dir / JSON_FILE).write_text(json.dumps(table, indent=2))
    (out_dir / MD_FILE).write_text(markdown(rows, model, compare_model, engines))
    return table


def default_table_dir(benchmark: str, model: str, out: str | None) -> Path:
    return Path(out) if out else Path("runs") / "eval" / f"{benchmark}-{Path(model.rstrip('/')).name}"


def evaluate_table(settings_for: Callable[[str, str, str], Any], model: str, out_dir: Path,
                   benchmarks: Sequence[str], compare_model: str | None = None,
                   with_left_out: bool = True, no_data: dict[str, str] | None = None) -> dict[str, Any]:
    """`run_table` with `run_eval` on `settings_for(bench, ckpt, out)` (EvalSettings), loading
    each checkpoint's engine once for all its benchmarks."""
    engines = runner.EngineReuse()

    def run_one(bench: str, ckpt: str, out: Path) -> dict[str, Any]:
        s = settings_for(bench, ckpt, str(out))
        return runner.run_eval(s, engine=engines.get(s))

    try:
        return run_table(run_one, model, out_dir, benchmarks, compare_model, with_left_out, no_data)
    finally:
        engines.close()
