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
from rstar2_cli.rl.run.validation import run_validation


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


def _heldout_recipe(tiny_model, tmp_path, problems: int):
    """A recipe validating `problems` held-out problems ("What is i+1?", answer (i+1) % 3) with
    4 samples each, and the tiny model's tokenizer."""
    from transformers import AutoTokenizer

    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"What is {i}+1?", "answer": str((i + 1) % 3)})
                               + "\n" for i in range(problems)))
    raw = tiny_rl_recipe(tiny_model, write_times_seven(tmp_path / "train.jsonl", 4), tmp_path / "run", steps=1)
    raw["train"].update(eval_every=5, eval_sets=[str(heldout)], eval_samples=4)
    return load_recipe_dict(raw), AutoTokenizer.from_pretrained(tiny_model)


def test_validation_uses_every_engine_and_matches_one_engine(tiny_model, tmp_path):
    cfg, tok = _heldout_recipe(tiny_model, tmp_path, 6)

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


def test_two_hosts_validate_interleaved_shares_and_rank_0_logs_what_one_host_logs(tiny_model, tmp_path):
    """Each rollout host evaluates every second held-out problem on its own engines; rank 0 merges
    the hosts' samples (what `rl_dist.gather_from` hands it) into the set's folder and logs the
    metrics, results and trajectories one host evaluating everything writes."""
    from rstar2_cli.rl.run.validation import merge_validation, validate_share

    cfg, tok = _heldout_recipe(tiny_model, tmp_path, 7)

    one_metrics, one_problems = _validate(cfg, [SeededAnswerEngine(tok)], tmp_path / "one")
    hosts = [[SeededAnswerEngine(tok)], [SeededAnswerEngine(tok), SeededAnswerEngine(tok)]]
    out = tmp_path / "two"
    parts = [validate_share(cfg, engines, object(), 5, out, host=h, hosts=2) for h, engines in enumerate(hosts)]
    metrics = merge_validation(cfg, parts, hosts[0], object(), 5, out)

    assert [sum(len(e.requests) for e in engines) for engines in hosts] == [4 * 4, 3 * 4]   # problems 0,2,4,6 / 1,3,5
    assert all(e.requests for e in hosts[1])                   # a host's engines share its samples
    assert metrics == one_metrics
    folder = "eval/step_000005/heldout"
    merged = json.loads((out / folder / "results.json").read_text())
    assert merged["per_problem"] == one_problems and merged["num_problems"] == 7
    one_file = tmp_path / "one" / folder / "trajectories.jsonl"
    assert (out / folder / "trajectories.jsonl").read_text() == one_file.read_text()
