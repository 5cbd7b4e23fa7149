"""Samples the engine failed (not the model) are counted and shown, in the table and results.json,
and a rerun of the same command draws them again."""
from __future__ import annotations

import json

from rich.console import Console
from test_eval_replicas import AnswerBySeed
from transformers import AutoTokenizer

from rstar2_cli.eval.metrics import summarize
from rstar2_cli.eval.runner import RESULTS_FILE, TRAJ_FILE, run_eval
from rstar2_cli.eval.settings import EvalSettings
from rstar2_cli.rollout.generation import EngineRequestError


class FailsSomeSeeds(AnswerBySeed):
    """A replica that fails the requests whose seed is in `failing` with the engine's own error
    (what `VLLMEngine` raises for a request vLLM failed)."""

    def __init__(self, tokenizer, failing: set[int]):
        super().__init__(tokenizer)
        self.failing = failing

    async def generate(self, req):
        if req.seed in self.failing:
            raise EngineRequestError(f"request failed in the engine (seed {req.seed})")
        return await super().generate(req)


def test_failed_samples_are_counted_shown_and_drawn_again_on_rerun(tiny_model, tmp_path):
    data = tmp_path / "set.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"{i}+1?", "answer": "0"}) + "\n"
                            for i in range(3)))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    s = EvalSettings(benchmark="custom", data=str(data), model=str(tiny_model), out_dir=str(tmp_path / "out"),
                     samples=2, max_turns=1, progress=False)
    healthy = AnswerBySeed(tok)
    console = Console(record=True, width=160)
    # Which seeds the run draws: a healthy run's records, each sample's seed from problem and index.
    first_seeds = []
    recording = FailsSomeSeeds(tok, set())
    original = recording.generate

    async def record(req):
        first_seeds.append(req.seed)
        return await original(req)

    recording.generate = record
    clean = run_eval(s.model_copy(update={"out_dir": str(tmp_path / "clean")}), engine=recording, tools=object(),
                     console=Console(record=True))
    assert clean["metrics"]["failed_samples"] == 0 and clean["metrics"]["failed_by_reason"] == {}

    broken = FailsSomeSeeds(tok, set(first_seeds[:2]))
    results = run_eval(s, engine=broken, tools=object(), console=console)
    m = results["metrics"]
    assert m["failed_samples"] == 2 and m["failed_by_reason"] == {"engine_error": 2}
    saved = json.loads((tmp_path / "out" / RESULTS_FILE).read_text())["metrics"]
    assert saved["failed_samples"] == 2
    text = console.export_text()
    assert "failed samples (scored 0)" in text and "2 of 6 (engine_error 2)" in text
    assert "run the same command again to draw them again" in text
    assert m["avg@2"] < clean["metrics"]["avg@2"]    # they scored 0, openly
    rows = [json.loads(line) for line in (tmp_path / "out" / TRAJ_FILE).read_text().splitlines()]
    assert sorted(r["infra_error"] or "" for r in rows) == ["", "", "", "", "engine_error", "engine_error"]

    # The rerun draws the failed samples again on a healthy engine; the result is the clean run's.
    again = run_eval(s, engine=healthy, tools=object(), console=Console(record=True))
    assert again["metrics"]["failed_samples"] == 0
    assert again["metrics"]["avg@2"] == clean["metrics"]["avg@2"]
    assert again["resumed_problems"] < 3 and healthy.requests > 0


def test_rows_written_before_the_infra_error_field_count_an_engine_error_as_failed():
    rows = [{"problem_id": "a", "sample_index": 0, "reward": 0.0, "finish_reason": "error"},
            {"problem_id": "a", "sample_index": 1, "reward": 1.0, "finish_reason": "stop"},
            {"problem_id": "b", "sample_index": 0, "reward": 0.0, "infra_error": "sandbox_internal_error"},
            {"problem_id": "b", "sample_index": 1, "reward": 0.0, "infra_error": None}]
    m = summarize(rows)
    assert m["failed_samples"] == 2
    assert m["failed_by_reason"] == {"engine_error": 1, "sandbox_internal_error": 1}
