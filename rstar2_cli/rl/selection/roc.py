"""GRPO-RoC: Resample-on-Correct downsampling of oversampled rollout groups (paper §3.1).

Why: with a binary outcome reward, a correct answer reached through failing tool calls or a
messy, repeated `<answer>` earns the same reward as a clean one, so plain GRPO reinforces the
noise. RoC rolls out 2G trajectories per prompt and keeps G: negatives uniformly (their
failure modes stay diverse), positives preferring low penalty (clean tool use, one answer).

Two selection modes:
- ``paper``: negatives keep ⌊|neg|·K/n⌋ uniformly at random, positives fill the other
  K − that = ⌈|pos|·K/n⌉ slots by weighted sampling without replacement with probability
  ∝ 1/(p_err + p_format + PENALTY_EPS) (``numpy.random.Generator.choice(replace=False, p=...)``
  draws one item at a time, each with probability ∝ p among the ones not yet drawn: successive
  weighted sampling). As in the release, each class keeps at least min(2, |class|) (negatives
  raised first, then positives; never more than K/2 each, so a K below 4 still keeps both
  classes), so a 31/1 group keeps its lone negative instead of being dropped. K = G when the group
  has at least oversample·G members, otherwise about half of them (⌈n/2⌉, at most G), so class proportions are kept.
- ``release``: microsoft/rStar ``down_sample/roc.py`` after PR #50 (verl recipe rstar2_agent):
  per-class counts ``round(|class|·G/n)`` (Python's banker's rounding), raised to at least 2
  negatives and 2 positives where the class has them, positives sorted by penalty (stable),
  negatives taken in rollout order (PR #50 removed their sort, reported in microsoft/rStar#49); groups with fewer than
  G members are dropped, groups with exactly G are kept whole. Where the release would trip its
  ``assert len(choices) == G`` (odd G with two .5 roundings) we keep what the counts give.

Penalties:
- paper: p_err = num_tool_errors / num_tool_calls over the calls whose outcome was the model's
  doing (sandbox internal errors are neither errors nor calls here), 0.5 when there were none
  (release value); p_format: an answer is a closed ``<answer>…</answer>`` pair; 1.0 when either
  tag is missing or the open/close counts differ from the number of closed pairs (malformed),
  else min(1, (answers − 1) / num_turns) with the agent loop's ``num_turns`` (every generated
  turn, the paper's definition); 0 turns gives 1.0.
- release: the release's own text arithmetic on the decoded response: p_err = the fraction of
  ``<tool_response>…</tool_response>`` blocks whose text contains "error" (any case), 0.5 with no
  block; p_format as above but with turns counted as ``<|im_start|>assistant…<|im_end|>`` spans
  in the response text, which misses the first turn (its marker is in the prompt) and an
  unfinished last one.

Faults (a sandbox internal error, which covers a worker crash, a queue timeout and a remote
backend error; an engine error; a grader timeout, crash or error) are not the model's doing:
such trajectories leave their group before selection and advantages (``exclusion.py`` decides,
per trajectory), and are counted in ``roc/infra_excluded`` and ``faults/excluded_<reason>``.

Groups are the sampled instances of the step (``Trajectory.group_index``, with the prompt id):
a problem drawn twice in one batch is two groups of G, not one of 2G.

Group filter (``reject_equal_reward``): groups whose rewards are all equal carry no GRPO signal
and are dropped. As in the release it runs on the full oversampled group before selection, and
again after selection (a safeguard; with the minimum of two per class it does not fire when
both classes are present).
With RoC disabled: the first G samples of each group, then the same filter.

Decisions: the selection records on every trajectory it sees why it kept or left it
(`Trajectory.roc_decision`: decision kept / dropped / filtered / excluded, its class, a one-line
rule; `decide`), which the rollout log writes as it is (`rl/logs/rollout_log.py`).
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal, Sequence

import numpy as np

from rstar2_cli.config import RocConfig
from rstar2_cli.rl.selection.exclusion import split_for_training
from rstar2_cli.rl.measures.tally import Tally
from rstar2_cli.rollout.trajectory import RocDecision, Trajectory

PENALTY_EPS = 1e-3          # keeps 1/(p+eps) finite for a perfect (zero-penalty) positive
RELEASE_MIN_NEGATIVES = 2   # min_zero_reward_trace_num in examples/run_qwen3-14b_rstar2_agent_weave.sh
RELEASE_MIN_POSITIVES = 2   # min_non_zero_reward_trace_num (same script); paper mode keeps them too

_ANSWER_PAIR = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)


def error_penalty(t: Trajectory) -> float:
    """Fraction of the model's tool calls that failed; 0.5 when it made none (infrastructure
    failures, `num_infra_tool_calls`, are not the model's calls)."""
    calls = t.num_tool_calls - t.num_infra_tool_calls
    if calls <= 0:
        return 0.5
    return min(1.0, t.num_tool_errors / calls)


def answer_count(text: str) -> int:
    """Number of closed <answer>…</answer> pairs."""
    return len(_ANSWER_PAIR.findall(text))


def _format_penalty(text: str, turns: int) -> float:
    if "<answer>" not in text or "</answer>" not in text:
        return 1.0
    pairs = answer_count(text)
    if text.count("<answer>") != pairs or text.count("</answer>") != pairs:
        return 1.0
    if turns <= 0:
        return 1.0
    return min(1.0, (pairs - 1) / turns)


def format_penalty(t: Trajectory) -> float:
    """1 for a missing/malformed answer, else min(1, (answers − 1) / turns)."""
    return _format_penalty(t.text, t.num_turns)


def release_error_penalty(text: str) -> float:
    """The release's p_err: tool-response blocks whose text contains "error", 0.5 with none."""
    blocks = _TOOL_RESPONSE.findall(text)
    if not blocks:
        return 0.5
    return sum("error" in b.lower() for b in blocks) / len(blocks)


def release_turn_count(text: str) -> int:
    """The release's turn count: `<|im_start|>assistant…<|im_end|>` spans in the response text."""
    return len(_ASSISTANT_TURN.findall(text))


def release_format_penalty(text: str) -> float:
    return _format_penalty(text, release_turn_count(text))


def penalties(t: Trajectory, mode: str = "paper") -> float:
    return sum(penalty_parts(t, mode))


def is_positive(t: Trajectory) -> bool:
    return t.reward > 0


def penalty_parts(t: Trajectory, mode: str = "paper") -> tuple[float, float]:
    """(p_err, p_format) as `penalties` adds them in `mode`."""
    if mode == "release":
        return release_error_penalty(t.text), release_format_penalty(t.text)
    return error_penalty(t), format_penalty(t)


def decide(t: Trajectory, decision: str, as_class: str | None, rule: str) -> None:
    """Record the selection's decision on `t` (kept, dropped, filtered or excluded)."""
    t.roc_decision = RocDecision(decision, as_class, rule)


def _mark(group: Sequence[Trajectory], chosen: Iterable[int], rules: dict[str, tuple[str, str]]) -> None:
    """Each member kept or dropped by `chosen`, with its class's (kept rule, dropped rule)."""
    chosen = set(chosen)
    for i, t in enumerate(group):
        cls = "positive" if is_positive(t) else "negative"
        decide(t, "kept" if i in chosen else "dropped", cls, rules[cls][i not in chosen])


def _whole(why: str) -> dict[str, tuple[str, str]]:
    return {c: (f"{c} kept: group kept whole ({why})", "") for c in ("positive", "negative")}


# ---------------------------------------------------------------- selection of one group


def _paper_select(group: Sequence[Trajectory], group_size: int, oversample: int,
                  rng: np.random.Generator) -> list[int]:
    n = len(group)
    keep = group_size if n >= oversample * group_size else min(group_size, (n + 1) // 2)
    if n <= keep:
        _mark(group, range(n), _whole(f"{n} <= K={keep}"))
        return list(range(n))
    neg = [i for i, t in enumerate(group) if not is_positive(t)]
    pos = [i for i, t in enumerate(group) if is_positive(t)]
    k_neg = (len(neg) * keep) // n
    k_pos = keep - k_neg                     # == ceil(|pos|·keep/n) <= |pos|
    # the release's minimum per class, at most half the slots (so a small K keeps both classes)
    min_neg, min_pos = (min(m, len(c), keep // 2) for m, c in ((RELEASE_MIN_NEGATIVES, neg),
                                                                (RELEASE_MIN_POSITIVES, pos)))
    if k_neg < min_neg:
        k_neg, k_pos = min_neg, keep - min_neg
    if k_pos < min_pos:
        k_pos, k_neg = min_pos, keep - min_pos
    chosen: list[int] = []
    if k_neg:
        chosen += [int(i) for i in rng.choice(neg, size=k_neg, replace=False)]
    if k_pos:
        w = np.array([1.0 / (penalties(group[i]) + PENALTY_EPS) for i in pos])
        chosen += [int(i) for i in rng.choice(pos, size=k_pos, replace=False, p=w / w.sum())]
    _mark(group, chosen, {
        "negative": (f"negative kept: uniform sample, {k_neg} of {len(neg)}",
                     f"negative dropped: uniform sample, {k_neg} of {len(neg)} kept"),
        "positive": (f"positive kept: sampled by 1/(p_err+p_format), {k_pos} of {len(pos)}",
                     f"positive dropped: sampled by 1/(p_err+p_format), {k_pos} of {len(pos)} kept")})
    return sorted(chosen)


def _release_select(group: Sequence[Trajectory], group_size: int) -> list[int] | None:
    """The release's per-uid selection; None = group dropped (fewer than G samples)."""
    n = len(group)
    if n < group_size:
        return None
    if n == group_size:
        _mark(group, range(n), _whole(f"{n} = G"))
        return list(range(n))
    neg = [i for i, t in enumerate(group) if not is_positive(t)]
    pos = sorted((i for i, t in enumerate(group) if is_positive(t)), key=lambda i: penalties(group[i], "release"))
    k_neg = round(len(neg) * group_size / n)
    k_pos = round(len(pos) * group_size / n)
    if k_neg < RELEASE_MIN_NEGATIVES and k_pos < RELEASE_MIN_POSITIVES:
        _mark(group, range(n), _whole("both classes under the release's minimum"))
        return list(range(n))
    if k_neg <= min(RELEASE_MIN_NEGATIVES, len(neg)):
        k_neg = min(RELEASE_MIN_NEGATIVES, len(neg))
        k_pos = group_size - k_neg
    if k_pos <= min(RELEASE_MIN_POSITIVES, len(pos)):
        k_pos = min(RELEASE_MIN_POSITIVES, len(pos))
        k_neg = group_size - k_pos
    _mark(group, pos[:k_pos] + neg[:k_neg], {
        "positive": (f"positive kept: lowest p_err+p_format, {k_pos} of {len(pos)}",
                     f"positive dropped: not among the {k_pos} lowest p_err+p_format"),
        "negative": (f"negative kept: first {k_neg} in rollout order",
                     f"negative dropped: after the first {k_neg} in rollout order")})
    return sorted(pos[:k_pos] + neg[:k_neg])


# ---------------------------------------------------------------- the whole step


@dataclass
class RocResult:
    groups: list[list[Trajectory]]                  # kept groups, each in rollout order
    dropped: Counter = field(default_factory=Counter)   # groups dropped, per reason
    metrics: dict[str, float] = field(default_factory=dict)   # counts, and the populations' metrics
    tally: Tally = field(default_factory=Tally)     # the populations' additive form (`population_tally`)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g]


def group_by_instance(trajectories: Iterable[Trajectory]) -> list[list[Trajectory]]:
    """Group by sampled instance, (group_index, prompt_id), in first-seen order, each group
    sorted by sample_index: a problem drawn twice in one batch makes two groups."""
    groups: dict[tuple[int, str], list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[(t.group_index, t.prompt_id)].append(t)
    return [sorted(g, key=lambda t: t.sample_index) for g in groups.values()]


def all_rewards_equal(group: Sequence[Trajectory]) -> bool:
    return len(group) == 0 or all(np.isclose(t.reward, group[0].reward) for t in group)


def population_tally(ts: Sequence[Trajectory], prefix: str) -> Tally:
    """The additive form of `population_metrics` (hosts' tallies merge: `rl/selection/step_summary.py`)."""
    pos = [t for t in ts if is_positive(t)]
    answers = [answer_count(t.text) for t in ts]
    n = {"n": len(ts), "positives": len(pos), "calls": sum(t.num_tool_calls for t in ts),
         "errors": sum(t.num_tool_errors for t in ts), "calls_positive": sum(t.num_tool_calls for t in pos),
         "errors_positive": sum(t.num_tool_errors for t in pos), "format": sum(format_penalty(t) for t in ts),
         "format_positive": sum(format_penalty(t) for t in pos), "answers": sum(answers),
         "zero_answer": sum(a == 0 for a in answers), "multi_answer": sum(a > 1 for a in answers)}
    return Tally(sums={f"{prefix}:{k}": float(v) for k, v in n.items()})


def population_metrics(tally: Tally, prefix: str) -> dict[str, float]:
    """Tool errors, format penalties and answers of one population (before or after selection)."""
    s = {k.split(":", 1)[1]: v for k, v in tally.sums.items() if k.startswith(f"{prefix}:")}

    def ratio(a: str, b: str) -> float:
        return s[a] / s[b] if s[b] else 0.0

    return {
        f"{prefix}/trajectories": s["n"],
        f"{prefix}/tool_error_ratio": ratio("errors", "calls"),
        f"{prefix}/tool_error_ratio_positive": ratio("errors_positive", "calls_positive"),
        f"{prefix}/format_penalty_mean": ratio("format", "n"),
        f"{prefix}/format_penalty_positive_mean": ratio("format_positive", "positives"),
        f"{prefix}/answers_per_rollout": ratio("answers", "n"),
        f"{prefix}/zero_answer_count": s["zero_answer"],
        f"{prefix}/multi_answer_count": s["multi_answer"],
    }


POPULATIONS = ("roc_before", "roc_after")


def _population_metrics(result: "RocResult", ts: Sequence[Trajectory], prefix: str) -> dict[str, float]:
    result.tally += population_tally(ts, prefix)
    return population_metrics(result.tally, prefix)


# one generator for every group, or a function giving each group its own
GroupRng = np.random.Generator | Callable[[Sequence[Trajectory]], np.random.Generator]


def downsample_groups(groups: Sequence[Sequence[Trajectory]], group_size: int,
                      mode: Literal["paper", "release"] = "paper",
                      rng: GroupRng | None = None, *, oversample: int = 2,
                      reject_equal_reward: bool = True) -> RocResult:
    """Select up to `group_size` trajectories from each oversampled group. `rng` as a function
    of the group: the trainer seeds each group by the run's seed, the step and the group's
    position in the batch (`rollout/batch_rollout.py`), so the choice does not depend on which rollout host
    selects the group or on how many hosts there are.

    Drop reasons: ``equal_reward`` (all rewards equal before selection),
    ``equal_reward_after_roc`` (after selection), ``too_few_samples`` (release mode, n < G),
    ``empty``.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if mode not in ("paper", "release"):
        raise ValueError(f"roc mode must be 'paper' or 'release', got {mode!r}")
    rng = rng if rng is not None else np.random.default_rng()
    before = [t for g in groups for t in g]
    result = RocResult(groups=[])
    result.metrics.update(_population_metrics(result, before, "roc_before"))
    for group in groups:
        group = list(group)
        if not group:
            result.dropped["empty"] += 1
            continue
        if reject_equal_reward and all_rewards_equal(group):
            _filter(result, group, "equal_reward", "group filtered: all rewards equal")
            continue
        if mode == "paper":
            chosen = _paper_select(group, group_size, oversample, rng(group) if callable(rng) else rng)
        else:
            chosen = _release_select(group, group_size)
            if chosen is None:
                _filter(result, group, "too_few_samples", f"group filtered: {len(group)} < G={group_size} samples")
                continue
        kept = [group[i] for i in chosen]
        if reject_equal_reward and all_rewards_equal(kept):
            _filter(result, group, "equal_reward_after_roc", "group filtered: the kept rewards all equal")
            continue
        result.groups.append(kept)
    _finish_metrics(result, groups)
    return result


def first_g_groups(groups: Sequence[Sequence[Trajectory]], group_size: int, *,
                   reject_equal_reward: bool = True) -> RocResult:
    """Plain GRPO: the first G samples of each group, then the equal-reward filter."""
    result = RocResult(groups=[])
    result.metrics.update(_population_metrics(result, [t for g in groups for t in g], "roc_before"))
    for group in groups:
        kept = list(group)[:group_size]
        if not kept:
            result.dropped["empty"] += 1
        elif reject_equal_reward and all_rewards_equal(kept):
            _filter(result, group, "equal_reward", "group filtered: all rewards equal")
        else:
            _mark(group, range(len(kept)), {c: (f"{c} kept: GRPO, first G={group_size}",
                                                  f"{c} dropped: GRPO, after the first G={group_size}")
                                              for c in ("positive", "negative")})
            result.groups.append(kept)
    _finish_metrics(result, groups)
    return result


def _filter(result: RocResult, group: Sequence[Trajectory], reason: str, rule: str) -> None:
    result.dropped[reason] += 1
    for t in group:
        decide(t, "filtered", None, rule)


def _finish_metrics(result: RocResult, groups: Sequence[Sequence[Trajectory]]) -> None:
    result.metrics.update(_population_metrics(result, result.trajectories, "roc_after"))
    result.metrics["roc/groups_in"] = float(len(groups))
    result.metrics["roc/groups_kept"] = float(len(result.groups))
    result.metrics["roc/groups_dropped"] = float(sum(result.dropped.values()))
    for reason, count in result.dropped.items():
        result.metrics[f"roc/dropped_{reason}"] = float(count)


def group_rng(seed: int, step: int) -> GroupRng:
    """RoC's generator for each group of step `step` (0-based): seeded by (seed, step, the group's
    prompt position), so the selection is the same whichever host makes it: N nodes reproduce one."""
    return lambda group: np.random.default_rng([seed, step, group[0].group_index])


def select_for_training(trajectories: Iterable[Trajectory], cfg: RocConfig, group_size: int,
                        rng: GroupRng) -> RocResult:
    """The trainer's entry point: leave out what is not the model's doing (`exclusion.py`), group
    by sampled instance, then RoC (cfg.enabled) or plain GRPO."""
    trajectories = list(trajectories)
    accountable, infra_metrics = split_for_training(trajectories, exclude_void_turns=cfg.exclude_void_turns)
    for t in trajectories:
        if t.exclusion is not None:
            decide(t, "excluded", None, f"excluded: {t.exclusion}")
    groups = group_by_instance(accountable)
    if not cfg.enabled:
        result = first_g_groups(groups, group_size, reject_equal_reward=cfg.reject_equal_reward)
    else:
        result = downsample_groups(groups, group_size, cfg.mode, rng, oversample=cfg.oversample,
                                   reject_equal_reward=cfg.reject_equal_reward)
    result.metrics.update(infra_metrics)
    return result
