"""Exact and near-duplicate removal, on rows of the real DAPO-Math-17k and on synthetic rows."""
from __future__ import annotations

from rstar2_cli.data.dedup import exact_dedup, near_dedup
from rstar2_cli.data.problems import Problem, load_problems


def test_exact_dedup_on_dapo_rows(data_dir):
    """The 55-row sample (tests/data/fixtures/README.md): raw copies with one answer are kept once,
    copies with two answers are dropped, normalisation merges "$1000$" with "1000"."""
    rows = load_problems("dapo_math_17k", data_dir=data_dir, allow_hub=False)
    assert len(rows) == 55
    result = exact_dedup(rows)
    assert {frozenset(p.id for p in g) for g in result.conflict_groups} == {
        frozenset(pair) for pair in (("dapo-00035", "dapo-00179"), ("dapo-02432", "dapo-05306"),
                                     ("dapo-05785", "dapo-10267"), ("dapo-05885", "dapo-09921"),
                                     ("dapo-11659", "dapo-11771"), ("dapo-12075", "dapo-12174"))}
    assert len(result.conflicts) == 12
    assert sorted(p.id for p in result.duplicates) == ["dapo-00733", "dapo-03110", "dapo-07586", "dapo-11896",
                                                       "dapo-14985"]
    assert len(result.kept) == 55 - 12 - 5
    assert {"dapo-00055", "dapo-00154", "dapo-10437", "dapo-11573"} <= {p.id for p in result.kept}


def test_exact_dedup_counts_on_the_full_dapo(full_training_set_dir):
    rows = load_problems("dapo_math_17k", data_dir=full_training_set_dir, allow_hub=False)
    assert len(rows) == 17917
    assert len({p.problem for p in rows}) == 17290  # SOURCES.md: distinct raw problem texts
    # Raw identical texts: SOURCES.md's 11 conflicting groups.
    raw_conflicts = {}
    for p in rows:
        raw_conflicts.setdefault(p.problem, set()).add(p.answer)
    assert sum(len(a) > 1 for a in raw_conflicts.values()) == 11
    # Our normalisation (spacing, $, \left/\right, leading space) merges 279 more texts into
    # 17,011 groups and finds 4 more conflicting ones (e.g. "$1000$" vs "1000", answers 61 vs 31).
    result = exact_dedup(rows)
    assert len(result.conflict_groups) == 15
    assert len(result.conflicts) == 30
    assert len(result.kept) == 17011 - 15
    assert len(result.duplicates) == 17917 - 16996 - 30
    answers = {frozenset(p.answer for p in g) for g in result.conflict_groups}
    assert frozenset({"-1", "554"}) in answers


def _p(pid, text, answer):
    return Problem(pid, text, answer, "t")


def test_exact_conflicts_dropped_agreeing_copies_kept_once():
    rows = [_p("a", "Find x.", "1"), _p("b", "find  $x$.", "1"), _p("c", "Find y.", "2"), _p("d", "FIND Y.", "3")]
    result = exact_dedup(rows)
    assert [p.id for p in result.kept] == ["a"]
    assert [p.id for p in result.duplicates] == ["b"]
    assert {p.id for p in result.conflicts} == {"c", "d"}


def test_near_dedup_merges_small_edits_and_keeps_answer_variants():
    base = ("A bag contains red and blue marbles. Two marbles are drawn without replacement and the "
            "probability that both are red is one third. What is the smallest possible number of marbles "
            "in the bag if there are at least ten marbles and at most one hundred marbles in total")
    rows = [_p("a", base + ".", "12"), _p("b", base + "?", "12"), _p("c", base + " !", "99"),
            _p("d", "Compute the sum of the first one hundred positive odd integers.", "10000")]
    result = near_dedup(rows, threshold=0.9)
    assert [p.id for p in result.kept] == ["a", "c", "d"]
    assert [p.id for p in result.duplicates] == ["b"]
    assert result.near_variants_kept == 1
