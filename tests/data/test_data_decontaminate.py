"""8-gram decontamination against the real eval sets, with planted overlaps."""
from __future__ import annotations

import pytest

from rstar2_cli.data.decontaminate import DecontaminationConfig, decontaminate
from rstar2_cli.data.problems import Problem, load_problems

# Shares only boilerplate 8-grams with AIME ("... is \frac{m}{n}, where m and n are relatively prime
# positive integers. Find m+n"), each found in more than ten training problems (12 rows of the sample).
BOILERPLATE_ROW = ("A jar holds red and green coins and one is drawn. The chance it is red is $\\frac{m}{n}$, "
                   "where $m$ and $n$ are relatively prime positive integers. Find $m+n$.")


@pytest.fixture(scope="module")
def eval_sets():
    return {n: load_problems(n, allow_hub=False) for n in ("aime24", "aime25", "math500", "hmmt25")}


@pytest.fixture(scope="module")
def dapo_sample(data_dir):
    """55 real rows, 12 of them with the m/n boilerplate (tests/data/fixtures/README.md)."""
    return load_problems("dapo_math_17k", data_dir=data_dir, allow_hub=False)


def test_planted_aime_sentence_is_removed_and_clean_rows_kept(eval_sets, dapo_sample):
    aime = eval_sets["aime24"][0]
    sentence = aime.problem.split(". ")[0]  # "Every morning Aya goes for a $9$-kilometer-long walk..."
    planted = Problem("planted", f"Consider this. {sentence}. How far does she walk in a week?", "63", "syn")
    clean = Problem("clean", "A frog hops along lily pads numbered one to twelve; in how many ways can it "
                             "reach the last pad using hops of one or two pads?", "144", "syn")
    boiler = Problem("boiler", BOILERPLATE_ROW, "7", "syn")
    result = decontaminate([*dapo_sample, planted, clean, boiler], eval_sets)
    removed = {p.id for p in result.removed}
    assert "planted" in removed and result.matches["planted"] == [f"aime24:{aime.id}"]
    assert "clean" not in removed and "boiler" not in removed
    assert result.hits_per_eval_set["aime24"] >= 1
    assert sum(result.hits_per_eval_set.values()) >= len(result.removed)


def test_plain_paper_rule_also_removes_boilerplate_overlap(eval_sets, dapo_sample):
    boiler = Problem("boiler", BOILERPLATE_ROW, "7", "syn")
    plain = decontaminate([*dapo_sample, boiler], eval_sets, DecontaminationConfig(boilerplate_min_problems=0))
    filtered = decontaminate([*dapo_sample, boiler], eval_sets)
    assert "boiler" in {p.id for p in plain.removed}
    assert len(plain.removed) > len(filtered.removed)


def test_full_copy_is_removed_even_when_frequent(eval_sets):
    aime = eval_sets["aime25"][3]
    copies = [Problem(f"c{i}", aime.problem, aime.answer, "syn") for i in range(12)]  # > boilerplate limit
    result = decontaminate(copies, eval_sets)
    assert not result.kept and result.hits_per_eval_set["aime25"] == 12


def test_config_is_validated():
    with pytest.raises(ValueError, match="copy_fraction"):
        DecontaminationConfig(copy_fraction=0)
