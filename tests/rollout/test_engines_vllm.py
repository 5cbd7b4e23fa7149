"""The real vLLM engine on the tiny model (CPU): token-exact generation, stop tokens, logprobs,
seeded sampling and in-place weight updates. ONE engine for the whole module (vLLM starts slowly)."""
from __future__ import annotations

import asyncio

import pytest

from rstar2_cli.rollout.engines import GenRequest, VLLMEngine

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rstar2_cli.models.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_engine") / "model", seed=0)


@pytest.fixture(scope="module")
def engine(tiny_path):
    from rstar2_cli.config import EngineConfig
    eng = VLLMEngine.from_config(str(tiny_path), EngineConfig(max_num_seqs=16), max_model_len=1024,
                                 seed=0, kv_cache_tokens=4096)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def hf_model(tiny_path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


@pytest.fixture(scope="module")
def prompt(tiny_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_path).encode("What is 12 + 30? Let me compute it with Python.")


def hf_greedy(model, prompt_ids, n):
    """Greedy continuation and each chosen token's logprob, straight from the HF forward pass."""
    import torch
    ids, logprobs = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            tok = int(lp.argmax())
            ids.append(tok)
            logprobs.append(float(lp[tok]))
    return ids[len(prompt_ids):], logprobs


async def test_greedy_tokens_and_logprobs_match_the_hf_model(engine, hf_model, prompt):
    out = await engine.generate(GenRequest(prompt, max_tokens=16, temperature=0.0, ignore_eos=True))
    ids, logprobs = hf_greedy(hf_model, prompt, 16)
    assert out.token_ids == ids
    assert out.finish_reason == "length" and out.stop_token_id is None
    assert len(out.logprobs) == len(out.token_ids)
    assert out.logprobs == pytest.approx(logprobs, abs=1e-3)   # both fp32 on CPU


async def test_generation_stops_exactly_on_a_stop_token(engine, prompt):
    free = await engine.generate(GenRequest(prompt, max_tokens=24, temperature=0.0, ignore_eos=True))
    pos = next(i for i in range(3, len(free.token_ids)) if free.token_ids[i] not in free.token_ids[:i])
    stop_id = free.token_ids[pos]
    out = await engine.generate(GenRequest(prompt, max_tokens=24, temperature=0.0, ignore_eos=True,
                                           stop_token_ids=[stop_id]))
    assert out.token_ids == free.token_ids[:pos + 1]
    assert out.token_ids[-1] == stop_id and out.finish_reason == "stop" and out.stop_token_id == stop_id
    assert len(out.logprobs) == len(out.token_ids)


async def test_seeded_sampling_is_reproducible(engine, prompt):
    req = lambda seed: GenRequest(prompt, max_tokens=20, temperature=1.0, seed=seed, ignore_eos=True)
    a, b, c = await asyncio.gather(engine.generate(req(7)), engine.generate(req(7)), engine.generate(req(8)))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids
    assert all(lp <= 0.0 for lp in a.logprobs)


def test_a_cpu_engine_sends_each_requests_seed(engine, prompt):
    """rollout.seed_requests auto on CPU: the engine keeps every request's seed (the test above)."""
    assert engine.seed_requests is True
    assert engine._sampling_params(GenRequest(prompt, max_tokens=4, seed=7)).seed == 7


def test_generate_batch_returns_results_in_request_order(engine, prompt):
    reqs = [GenRequest(prompt, max_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 1, 9)]
    outs = engine.generate_batch(reqs)
    assert [len(o.token_ids) for o in outs] == [5, 1, 9]
    assert outs[0].token_ids == outs[2].token_ids[:5]


async def test_kv_usage_is_reported_while_generating(engine, prompt):
    assert engine.kv_capacity_tokens >= 4096
    task = asyncio.create_task(engine.generate(GenRequest(prompt, max_tokens=600, ignore_eos=True)))
    seen = []
    while not task.done():
        seen.append(engine.kv_free_fraction())
        await asyncio.sleep(0.01)
    await task
    assert all(0.0 <= f <= 1.0 for f in seen)
    assert min(seen) < 1.0


async def test_weight_update_changes_output_and_restores(engine, tiny_path, prompt):
    from safetensors.torch import load_file
    original = load_file(str(tiny_path / "model.safetensors"))
    greedy = GenRequest(prompt, max_tokens=12, temperature=0.0, ignore_eos=True)
    before = await engine.generate(greedy)
    await engine.update_weights((k, -v if k == "lm_head.weight" else v) for k, v in original.items())
    flipped = await engine.generate(greedy)
    assert flipped.token_ids != before.token_ids
    await engine.update_weights(original.items())
    assert (await engine.generate(greedy)).token_ids == before.token_ids


async def test_weight_update_refuses_while_generation_is_in_flight(engine, tiny_path, prompt):
    from safetensors.torch import load_file
    original = load_file(str(tiny_path / "model.safetensors"))
    task = asyncio.create_task(engine.generate(GenRequest(prompt, max_tokens=400, ignore_eos=True)))
    await asyncio.sleep(0.05)
    with pytest.raises(RuntimeError, match="in flight"):
        await engine.update_weights(original.items())
    assert len((await task).token_ids) == 400


def test_prompt_that_fills_the_context_is_a_clear_error(engine):
    """The request's own failure (an engine fault for that trajectory, rl/selection/exclusion.py), named."""
    from rstar2_cli.rollout.generation import EngineRequestError

    with pytest.raises(EngineRequestError, match="leaves no room in max_model_len=1024"):
        engine.generate_batch([GenRequest(list(range(5, 5 + 1024)), max_tokens=4)])


async def test_a_paused_update_lands_between_requests_and_stamps_versions(engine, tiny_path, prompt):
    """Asynchronous RL updates weights while rollouts run: the turn in flight finishes on the old
    weights (its tokens are the old greedy ones), a turn sent during the pause waits and runs on
    the new weights, and each result names the version that generated it."""
    from rstar2_cli.rollout.weight_sync.chunked import push_weights
    from safetensors.torch import load_file
    original = load_file(str(tiny_path / "model.safetensors"))
    flipped = {k: (-v if k == "lm_head.weight" else v) for k, v in original.items()}
    long = GenRequest(prompt, max_tokens=300, temperature=0.0, ignore_eos=True)
    short = GenRequest(prompt, max_tokens=12, temperature=0.0, ignore_eos=True)
    old_long = (await engine.generate(long)).token_ids
    old_short = (await engine.generate(short)).token_ids
    v0 = engine.weights_version
    running = asyncio.create_task(engine.generate(long))
    await asyncio.sleep(0.05)
    await engine.pause_for_update()                     # waits for the running turn
    assert running.done()
    queued = asyncio.create_task(engine.generate(short))
    await asyncio.sleep(0.1)
    assert not queued.done()                            # nothing runs while paused
    await push_weights([engine], flipped.items(), paused=True)
    await engine.resume_after_update()
    first, second = await running, await queued
    assert first.token_ids == old_long and first.policy_version == v0
    assert second.token_ids != old_short and second.policy_version == v0 + 1 == engine.weights_version
    await engine.update_weights(original.items())        # restore for the other tests
    assert (await engine.generate(short)).token_ids == old_short
