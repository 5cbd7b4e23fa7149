"""`rstar2 eval` end to end on the tiny model: every set shipped with rstar2 (no data folder), a data
folder's own copy of a set, resume, custom data, bad data."""
from __future__ import annotations

import json

import pytest

from rstar2_cli.eval.runner import RESULTS_FILE, TRAJ_FILE, run_eval
from rstar2_cli.eval.benchmarks import MATH_SETS as BENCHMARKS
from rstar2_cli.eval.settings import EvalSettings

pytestmark = pytest.mark.slow


@pytest.fixture
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture
def tools(sandbox_pool):
    return sandbox_pool


def _settings(tiny_model, data_dir, out, **kw) -> EvalSettings:
    base = dict(benchmark="aime24", model=str(tiny_model), data_dir=str(data_dir) if data_dir else None,
                out_dir=str(out), samples=2, max_tokens=48, max_turns=2, limit=2, progress=False)
    base.update(kw)
    return EvalSettings(**base)


@pytest.mark.parametrize("bench", BENCHMARKS)
def test_eval_each_shipped_set(bench, tiny_model, tmp_path, engine, tools, monkeypatch):
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    res = run_eval(_settings(tiny_model, None, tmp_path / bench, benchmark=bench), engine=engine, tools=tools)
    m = res["metrics"]
    assert m["problems"] == 2 and m["samples_per_problem"] == 2
    assert 0.0 <= m["avg@2"] <= 1.0 and "pass@2" in m and "maj@2" in m
    rows = [json.loads(l) for l in (tmp_path / bench / TRAJ_FILE).read_text().splitlines()]
    assert len(rows) == 4
    assert {(r["problem_id"], r["sample_index"]) for r in rows} == {
        (p, i) for p in {r["problem_id"] for r in rows} for i in range(2)}
    for r in rows:   # the budget holds, tool tokens included
        assert r["response_tokens"] <= 48 and r["turns"] <= 2
    saved = json.loads((tmp_path / bench / RESULTS_FILE).read_text())
    assert saved["settings"]["temperature"] == 0.6 and saved["settings"]["max_turns"] == 2
    assert len(saved["per_problem"]) == 2


def test_a_set_in_the_data_dir_wins_over_the_shipped_one(tiny_model, tmp_path, engine, tools):
    mine = tmp_path / "data"
    mine.mkdir()
    (mine / "aime25.jsonl").write_text(json.dumps({"id": "mine-1", "problem": "What is 2+3?", "answer": "5"}) + "\n")
    res = run_eval(_settings(tiny_model, mine, tmp_path / "o", benchmark="aime25", samples=1), engine=engine,
                   tools=tools)
    assert res["metrics"]["problems"] == 1
    assert [json.loads(line)["problem_id"] for line in (tmp_path / "o" / TRAJ_FILE).read_text().splitlines()] == [
        "mine-1"]


def test_eval_resume_skips_done_samples(tiny_model, data_dir, tmp_path, engine, tools):
    out = tmp_path / "resume"
    run_eval(_settings(tiny_model, data_dir, out, limit=1), engine=engine, tools=tools)
    first = (out / TRAJ_FILE).read_text().splitlines()
    # a second run over 2 problems only generates the new one; the first one's lines are untouched
    res = run_eval(_settings(tiny_model, data_dir, out, limit=2), engine=engine, tools=tools)
    lines = (out / TRAJ_FILE).read_text().splitlines()
    assert lines[: len(first)] == first and len(lines) == 4
    assert res["resumed_problems"] == 1
    # a third run generates nothing
    res = run_eval(_settings(tiny_model, data_dir, out, limit=2), engine=engine, tools=tools)
    assert res["resumed_problems"] == 2 and len((out / TRAJ_FILE).read_text().splitlines()) == 4


def test_eval_custom_file_and_bad_rows(tiny_model, tmp_path, engine, tools):
    from rstar2_cli.data.problems import DataError

    good = tmp_path / "mine.jsonl"
    good.write_text(json.dumps({"id": "a", "problem": "What is 2+3?", "answer": "5"}) + "\n")
    res = run_eval(_settings(tiny_model, tmp_path, tmp_path / "o1", benchmark="custom", data=str(good), samples=1),
                   engine=engine, tools=tools)
    assert res["metrics"]["problems"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "problem": "x", "answer": "1"}) + "\n" + '{"id": "b", "problem": "y"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        run_eval(_settings(tiny_model, tmp_path, tmp_path / "o2", benchmark="custom", data=str(bad)),
                 engine=engine, tools=tools)


def test_eval_settings_reject_bad_input():
    with pytest.raises(ValueError, match="base-url"):
        EvalSettings(benchmark="aime24", model="m", engine="openai")
    with pytest.raises(ValueError, match="unknown benchmark"):
        EvalSettings(benchmark="aime26", model="m")


def test_two_replicas_give_what_one_gives(tiny_model, data_dir, tmp_path, engine, tools):
    """The same settings on one replica and on two (the second with another engine seed): the same
    trajectories, as each request carries its own seed on CPU; the second replica did take work."""
    from rstar2_cli.config import EngineConfig
    from rstar2_cli.rollout.engines import VLLMEngine

    second = VLLMEngine.from_config(str(tiny_model), EngineConfig(), max_model_len=2048, seed=1)
    try:
        kw = dict(samples=3, max_tokens=40, temperature=1.0)
        one = run_eval(_settings(tiny_model, data_dir, tmp_path / "one", **kw), engine=engine, tools=tools)
        two = run_eval(_settings(tiny_model, data_dir, tmp_path / "two", **kw), engine=[engine, second], tools=tools)
        assert second.busy_seconds() > 0.0
    finally:
        second.shutdown()
    rows = {name: sorted((json.loads(line) for line in (tmp_path / name / TRAJ_FILE).read_text().splitlines()),
                         key=lambda r: (r["problem_id"], r["sample_index"])) for name in ("one", "two")}
    assert [r["text"] for r in rows["one"]] == [r["text"] for r in rows["two"]]
    assert len({r["text"] for r in rows["one"]}) > 1          # sampled, not one greedy answer
    assert one["metrics"] == two["metrics"] and one["per_problem"] == two["per_problem"]
    assert (one["engines"]["replicas"], two["engines"]["replicas"]) == (1, 2)
