"""Outcome-reward throughput: grades/s of `GraderPool.grade_batch` against plain math-verify.

Two batches, each measured against a baseline in the same run (the machine is noisy):
* integer: AIME/DAPO-style responses with integer gold answers (the RL common case, served by the
  no-hang fast path). Target: >= 2,000 grades/s on 2 cores.
* symbolic: MATH-500's non-integer gold answers (fractions, radicals, intervals, tuples, text),
  once with the gold itself and once with a neighbouring problem's gold (mostly wrong), all in
  the worker pool.
Baseline: math-verify `parse`/`verify` called serially in this process, the naive reward loop
(signal timeouts, no isolation), on the same items. Prints a rich table; `--json PATH` writes it.

    python benchmarks/timing/bench_reward.py --json out/bench_reward.json
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.data.problems import find_named_set_file, resolve_data_dir  # noqa: E402
from rstar2_cli.reward import GraderPool  # noqa: E402

_INTEGER = re.compile(r"-?\d+")


def _response(answer: str, rng: random.Random) -> str:
    prefix = "Let me compute this with the tool.\n```python\nprint(6 * 7)\n```\nSo the result follows.\n"
    return f"{prefix * rng.randint(1, 4)}<answer>The final answer is \\boxed{{{answer}}}.</answer>"


def integer_batch(n: int, rng: random.Random) -> list[tuple[str, str]]:
    pairs = []
    for _ in range(n):
        gold = rng.randint(0, 999)
        pred = gold if rng.random() < 0.5 else rng.choice([gold + 1, gold * 10, -gold, rng.randint(0, 999)])
        answer = rng.choice(["{}", "{}", "\\text{{{}}}", "x = {}", "{}^\\circ", "{:,}"]).format(pred)
        pairs.append((_response(answer, rng), str(gold)))
    return pairs


def symbolic_batch(math500: Path, rng: random.Random) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in math500.read_text(encoding="utf-8").splitlines()]
    golds = [r["answer"] for r in rows if not _INTEGER.fullmatch(r["answer"].strip())]
    pairs = [(_response(g, rng), g) for g in golds]
    pairs += [(f"<answer>\\boxed{{{golds[(i + 1) % len(golds)]}}}</answer>", g) for i, g in enumerate(golds)]
    return pairs


def baseline_rate(pairs: list[tuple[str, str]], progress: Progress, label: str) -> tuple[float, list[bool]]:
    """math-verify in-process, serially, parsing the whole response as a naive reward loop would."""
    from math_verify import parse, verify

    task = progress.add_task(f"baseline {label}", total=len(pairs))
    verdicts = []
    with Stopwatch() as sw:
        for response, gold in pairs:
            verdicts.append(bool(verify(parse(f"\\boxed{{{gold}}}"), parse(response))))
            progress.advance(task)
    return len(pairs) / sw.seconds, verdicts


def pool_rate(pool: GraderPool, pairs: list[tuple[str, str]], timeout: float) -> tuple[float, list[bool], dict]:
    with Stopwatch() as sw:
        results = pool.grade_batch(pairs, timeout=timeout)
    rate = len(pairs) / sw.seconds
    reasons: dict[str, int] = {}
    for r in results:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return rate, [r.reward == 1.0 for r in results], reasons


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-integer", type=int, default=20_000, help="integer-batch size")
    parser.add_argument("--n-baseline", type=int, default=1_000, help="integer items for the serial baseline")
    parser.add_argument("--workers", type=int, default=None, help="grader processes (default: all cores)")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-item grading timeout, seconds")
    parser.add_argument(
        "--data-dir", type=Path, default=None,
        help="folder with math500.jsonl (default $RSTAR2_DATA_DIR, else the copy shipped with rstar2)"
    )
    add_json_option(parser)
    args = parser.parse_args()
    math500 = find_named_set_file("math500", resolve_data_dir(args.data_dir))
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    rng = random.Random(0)
    ints = integer_batch(args.n_integer, rng)
    symbolic = symbolic_batch(math500, rng)
    console = Console()
    rows = []
    with GraderPool(args.workers) as pool, Progress(console=console, transient=True) as progress:
        pool.grade_batch(symbolic[:4], timeout=args.timeout)  # workers up and warm
        for name, pairs, baseline_pairs in (
            ("integer", ints, ints[: args.n_baseline]),
            ("symbolic", symbolic, symbolic),
        ):
            rate, ours, reasons = pool_rate(pool, pairs, args.timeout)
            base_rate, base = baseline_rate(baseline_pairs, progress, name)
            agree = sum(a == b for a, b in zip(ours, base)) / len(base)
            rows.append({
                "batch": name, "items": len(pairs), "grades_per_s": round(rate, 1),
                "baseline_items": len(baseline_pairs), "baseline_grades_per_s": round(base_rate, 1),
                "ratio": round(rate / base_rate, 2), "agreement_with_baseline": round(agree, 4),
                "reasons": reasons, "workers": pool.workers.size,
            })
    table = Table(title="Outcome reward throughput (baseline: math-verify serial, in-process)")
    for col in ("batch", "items", "grades/s", "baseline grades/s", "ratio", "agree", "reasons"):
        table.add_column(col, justify="left" if col in ("batch", "reasons") else "right")
    for r in rows:
        table.add_row(r["batch"], str(r["items"]), f"{r['grades_per_s']:,.0f}", f"{r['baseline_grades_per_s']:,.0f}",
                      f"{r['ratio']:.1f}x", f"{r['agreement_with_baseline']:.1%}",
                      ", ".join(f"{k}={v}" for k, v in sorted(r["reasons"].items())))
    console.print(table)
    write_json(args.json, {"benchmark": "reward", "results": rows})
    if args.json:
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
