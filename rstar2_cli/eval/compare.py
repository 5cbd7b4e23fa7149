"""Two checkpoints on the same questions: the difference and its 95 % interval.

Method: a paired normal interval over questions. Each question's score is the fraction of its k
samples that were correct (results.json `per_problem[].solved_fraction`); on the n questions both
runs answered, d_i = score_A(i) - score_B(i), the difference is mean(d), its standard error is
stdev(d) / sqrt(n) (sample standard deviation, ddof=1), and the interval is
mean(d) +- 1.959964 * se. Pairing by question removes the between-question spread that dominates
an unpaired comparison (a hard question is hard for both checkpoints), and averaging the k
samples inside a question first makes the questions, not the samples, the independent units.
With n = 1 the standard error is 0 and the interval collapses to the point (flagged by `n`).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping

Z95 = 1.959963984540054       # the standard normal's 97.5 % quantile
METHOD = "paired normal interval over questions (mean difference +- 1.96 * stdev(d)/sqrt(n))"


def per_question(results: Mapping[str, Any]) -> dict[str, float]:
    """question id -> solved fraction, from a results.json dict."""
    return {str(r["problem_id"]): float(r["solved_fraction"]) for r in results["per_problem"]}


def paired_difference(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, Any]:
    """A - B over the questions both have (see the module docstring); ValueError when none are shared."""
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two result sets share no question id")
    d = [a[q] - b[q] for q in common]
    n = len(d)
    mean = statistics.fmean(d)
    se = statistics.stdev(d) / math.sqrt(n) if n > 1 else 0.0
    return {"n": n, "a": statistics.fmean(a[q] for q in common), "b": statistics.fmean(b[q] for q in common),
            "diff": mean, "ci95": [mean - Z95 * se, mean + Z95 * se], "se": se, "method": METHOD,
            "only_in_a": len(set(a) - set(b)), "only_in_b": len(set(b) - set(a))}

