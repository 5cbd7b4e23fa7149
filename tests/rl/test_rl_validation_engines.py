"""Held-out validation inside an RL run spreads its samples over every engine of the rollout host,
and the results are the same as on one engine (each sample's seed comes from its problem and index)."""
from __future__ import annotations

import asyncio
import json

import pytest
from api_contracts import assert_fake_methods_match
from rl_synthetic import tiny_rl_recipe, write_times_seven

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rollout.generation import GenRequest, GenResult
from rstar2_cli.rl.validation import run_validation


class SeededAnswerEngine:
    """Answers `\\boxed{seed % 3}` then end-of-turn: what it says depends on the request's seed only,
    as a seeded vLLM sample does on fixed weights, never on which engine got the request."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.kv_capacity_tokens = 10_000
        self.requests: list[GenRequest] = []

    async def generate(self, req: GenRequest) -> GenResult:
        self.requests.append(req)
        await asyncio.sleep(0)                      # requests overlap, as on a real engine
        ids = self.tokenizer.encode(f"The answer is \\boxed{{{req.seed % 3}}}.", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        return GenResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                         stop_token_id=self.tokenizer.eos_token_id)

    def kv_free_fraction(self) -> float:
        return 1.0


def test_fake_engine_has_the_real_engine_api():
    from rstar2_cli.rollout.engines import VLLMEngine

    assert_fake_methods_match(SeededAnswerEngine, VLLMEngine, ["generate", "kv_free_fraction"])


def _validate(cfg, engines, out_dir):
    metrics = run_validation(cfg, engines, object(), 5, out_dir)   # no tool call is made: no sandbox needed
    results = json.loads((out_dir / "eval" / "step_000005" / "heldout" / "results.json").read_text())
    return metrics, results["per_problem"]


def test_validation_uses_every_engine_and_matches_one_engine(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"What is {i}+1?", "answer": str((i + 1) % 3)})
                               + "\n" for i in range(6)))
    raw = tiny_rl_recipe(tiny_model, write_times_seven(tmp_path / "train.jsonl", 4), tmp_path / "run", steps=1)
    raw["train"].update(eval_every=5, eval_sets=[str(heldout)], eval_samples=4)
    cfg = load_recipe_dict(raw)
    tok = AutoTokenizer.from_pretrained(tiny_model)

    alone = SeededAnswerEngine(tok)
    one_metrics, one_problems = _validate(cfg, [alone], tmp_path / "one")
    pair = [SeededAnswerEngine(tok), SeededAnswerEngine(tok)]
    two_metrics, two_problems = _validate(cfg, pair, tmp_path / "two")

    assert len(alone.requests) == 6 * 4
    assert all(e.requests for e in pair), [len(e.requests) for e in pair]
    assert sum(len(e.requests) for e in pair) == 6 * 4
    assert 0.0 < one_metrics["eval/heldout/accuracy"] < 1.0          # the seeds decide: some right, some wrong
    assert two_metrics == one_metrics
    assert two_problems == one_problems


def test_validation_without_an_engine_says_so(tmp_path, tiny_model):
    raw = tiny_rl_recipe(tiny_model, write_times_seven(tmp_path / "train.jsonl", 4), tmp_path / "run", steps=1)
    with pytest.raises(ValueError, match="no engine"):
        run_validation(load_recipe_dict(raw), [], object(), 5, tmp_path)
