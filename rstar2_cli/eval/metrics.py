"""Evaluation metrics over per-sample records: avg@k, pass@k, maj@k, length and tool statistics.

The paper reports avg@k (mean pass@1 over k samples per problem) with its spread, next to
response length and tool usage. These are pure functions over plain records (no torch) so the
eval command, RL validation and notebooks compute the numbers the same way.

A sample is correct when its `reward > 0` (works for 0/1 and -1/+1 rewards). A sample *failed*
when the infrastructure, not the model, ended it (`infra_error`: an engine error, a tool call lost
to a sandbox internal error; rows written before that field: finish_reason "error"). A failed
sample scores 0 like a wrong one, so avg@k keeps its k; `summarize` counts the failed ones, and the
report and results.json show them, so a score with failures in it is never read as the model's.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class SampleRecord:
    problem_id: str
    sample_index: int
    reward: float
    extracted: str | None = None
    response_tokens: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    failure: str = ""       # non-empty: why the infrastructure ended this sample (it scores 0)

    @property
    def correct(self) -> bool:
        return self.reward > 0

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "SampleRecord":
        try:
            return cls(
                problem_id=str(row["problem_id"]), sample_index=int(row["sample_index"]),
                reward=float(row["reward"]), extracted=row.get("extracted"),
                response_tokens=int(row.get("response_tokens", 0)), turns=int(row.get("turns", 0)),
                tool_calls=int(row.get("tool_calls", 0)), tool_errors=int(row.get("tool_errors", 0)),
                failure=failure_of(row),
            )
        except KeyError as e:
            raise ValueError(f"sample record missing field {e.args[0]!r}: {dict(row)}") from None


def failure_of(row: Mapping[str, Any]) -> str:
    """Why the infrastructure ended a trajectories.jsonl sample ("" if it did not)."""
    if row.get("infra_error"):
        return str(row["infra_error"])
    return "engine_error" if row.get("finish_reason") == "error" else ""


def as_records(rows: Iterable[SampleRecord | Mapping[str, Any]]) -> list[SampleRecord]:
    return [r if isinstance(r, SampleRecord) else SampleRecord.from_dict(r) for r in rows]


def by_problem(records: Sequence[SampleRecord]) -> dict[str, list[SampleRecord]]:
    """Samples per problem, sorted by sample_index; duplicate indices raise ValueError."""
    groups: dict[str, list[SampleRecord]] = defaultdict(list)
    for r in records:
        groups[r.problem_id].append(r)
    for pid, samples in groups.items():
        samples.sort(key=lambda r: r.sample_index)
        indices = [r.sample_index for r in samples]
        if len(set(indices)) != len(indices):
            raise ValueError(f"problem {pid!r}: duplicate sample_index in {indices}")
    return dict(groups)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), for n samples, c correct.

    k > n cannot be estimated from n samples and raises ValueError (draw more samples or lower k).
    """
    if not (0 <= c <= n) or k < 1:
        raise ValueError(f"invalid pass@k arguments n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(records: Sequence[SampleRecord], k: int) -> float:
    """pass@k averaged over problems."""
    groups = by_problem(records)
    if not groups:
        raise ValueError("no records")
    return statistics.fmean(pass_at_k(len(s), sum(r.correct for r in s), k) for s in groups.values())


def avg_at_k(records: Sequence[SampleRecord], k: int) -> tuple[float, float]:
    """(avg@k, std): mean accuracy over sample indices 0..k-1, and the population std (ddof=0)
    of the k per-index accuracies (accuracy of "run i" = fraction of problems sample i solved).

    Every problem must have samples 0..k-1; a missing one raises ValueError naming the problem.
    """
    groups = by_problem(records)
    if not groups or k < 1:
        raise ValueError(f"avg@k needs records and k >= 1 (k={k})")
    per_index = []
    for i in range(k):
        hits = []
        for pid, samples in groups.items():
            match = [r for r in samples if r.sample_index == i]
            if not match:
                raise ValueError(f"problem {pid!r} has no sample_index {i} (avg@{k} needs 0..{k - 1})")
            hits.append(match[0].correct)
        per_index.append(sum(hits) / len(hits))
    return statistics.fmean(per_index), statistics.pstdev(per_index)


def majority_answer(samples: Sequence[SampleRecord]) -> SampleRecord | None:
    """The first sample carrying the most frequent extracted answer (None if nothing extracted).

    Ties go to the answer that appears at the smallest sample_index, so the result does not
    depend on record order. Samples with no extracted answer (None or "") do not vote.
    """
    votes: dict[str, list[SampleRecord]] = defaultdict(list)
    for r in sorted(samples, key=lambda r: r.sample_index):
        if r.extracted not in (None, ""):
            votes[str(r.extracted).strip()].append(r)
    if not votes:
        return None
    best = max(votes.values(), key=lambda group: (len(group), -group[0].sample_index))
    return best[0]


def maj_at_k(records: Sequence[SampleRecord], k: int) -> float:
    """Fraction of problems whose majority answer over samples 0..k-1 is correct."""
    groups = by_problem(records)
    if not groups:
        raise ValueError("no records")
    solved = 0
    for pid, samples in groups.items():
        first_k = [r for r in samples if r.sample_index < k]
        if len(first_k) < k:
            raise ValueError(f"problem {pid!r}: maj@{k} needs {k} samples, got {len(first_k)}")
        winner = majority_answer(first_k)
        solved += bool(winner is not None and winner.correct)
    return solved / len(groups)


def _mean_median(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "median": float(statistics.median(values))} if values \
        else {"mean": 0.0, "median": 0.0}


def usage_stats(records: Sequence[SampleRecord]) -> dict[str, Any]:
    """Mean/median response tokens, turns and tool calls; tool-error rate = errors / calls;
    tool-call rate = the fraction of samples that made at least one call."""
    calls = sum(r.tool_calls for r in records)
    return {
        "tool_call_rate": sum(r.tool_calls > 0 for r in records) / len(records) if records else 0.0,
        "response_tokens": _mean_median([r.response_tokens for r in records]),
        "turns": _mean_median([r.turns for r in records]),
        "tool_calls": _mean_median([r.tool_calls for r in records]),
        "tool_error_rate": sum(r.tool_errors for r in records) / calls if calls else 0.0,
    }


def per_problem_summary(records: Sequence[SampleRecord]) -> list[dict[str, Any]]:
    """One row per problem: samples, solved fraction, mean response tokens / turns / tool calls."""
    rows = []
    for pid, samples in sorted(by_problem(records).items()):
        rows.append({
            "problem_id": pid, "samples": len(samples),
            "solved_fraction": sum(r.correct for r in samples) / len(samples),
            "mean_response_tokens": statistics.fmean(r.response_tokens for r in samples),
            "mean_turns": statistics.fmean(r.turns for r in samples),
            "mean_tool_calls": statistics.fmean(r.tool_calls for r in samples),
        })
    return rows


def summarize(rows: Iterable[SampleRecord | Mapping[str, Any]], ks: Sequence[int] = (1,)) -> dict[str, Any]:
    """All metrics at once: avg@n with std (n = samples per problem), pass@k and maj@k for each
    k in `ks` that does not exceed n, usage statistics and the number of problems."""
    records = as_records(rows)
    groups = by_problem(records)
    if not groups:
        raise ValueError("no records")
    n = min(len(s) for s in groups.values())
    avg, std = avg_at_k(records, n)
    out: dict[str, Any] = {"problems": len(groups), "samples_per_problem": n,
                           f"avg@{n}": avg, f"avg@{n}_std": std}
    for k in ks:
        if k <= n:
            out[f"pass@{k}"] = mean_pass_at_k(records, k)
            out[f"maj@{k}"] = maj_at_k(records, k)
    out.update(usage_stats(records))
    failures = [r.failure for r in records if r.failure]
    out["failed_samples"] = len(failures)
    out["failed_by_reason"] = {reason: failures.count(reason) for reason in sorted(set(failures))}
    return out
