"""`rstar2 prepare hard`: rollouts with the agent loop on the tiny model, then the hard subset."""
from __future__ import annotations

import json

import pytest

from rstar2_cli.prepare.mine_hard import mine_hard, mining_settings


@pytest.mark.slow
def test_prepare_hard_on_tiny_model(tiny_model, tiny_engine, sandbox_pool, tmp_path):
    rows = [{"id": f"q{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "hard.jsonl"
    given = {"data": str(data), "max_response_tokens": 32, "max_turns": 2, "temperature": 1.0, "top_p": 1.0}
    settings = mining_settings(None, {name: (value, "test") for name, value in given.items()})
    summary = mine_hard(str(tiny_model), out, settings, samples=2, progress=False, engine=tiny_engine,
                        tools=sandbox_pool)
    # a random tiny model solves nothing, so every problem is hard, each with its pass rate
    kept = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["id"] for r in kept] == ["q0", "q1", "q2"]
    assert all(r["pass_rate"] == 0.0 and {"problem", "answer"} <= set(r) for r in kept)
    saved = json.loads((tmp_path / "hard.jsonl.pass_rates.json").read_text())
    assert saved["hard"] == 3 and saved["samples"] == 2 and set(saved["pass_rates"]) == {"q0", "q1", "q2"}
    assert summary["solved_all"] == 0
    # the rollouts are kept for resume: a second run generates nothing new
    n_lines = len((tmp_path / "hard.rollouts" / "trajectories.jsonl").read_text().splitlines())
    mine_hard(str(tiny_model), out, settings, samples=2, progress=False, engine=tiny_engine, tools=sandbox_pool)
    assert len((tmp_path / "hard.rollouts" / "trajectories.jsonl").read_text().splitlines()) == n_lines == 6
