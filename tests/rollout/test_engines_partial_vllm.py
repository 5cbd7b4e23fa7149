"""Partial rollouts on the real vLLM engine (CPU, tiny model): `pause_generation(mode="keep",
clear_cache=True)` stops a running request at a token boundary, the weights change, and the
request continues on the new weights with its prefix re-prefilled (no KV of the old weights),
each token stamped with the version that sampled it."""
from __future__ import annotations

import pytest

from rstar2_cli.rollout.engines import GenRequest, VLLMEngine

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MAX_LEN = 1024


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from rstar2_cli.models.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny_partial") / "model", seed=0)


@pytest.fixture(scope="module")
def engine(tiny_path):
    from rstar2_cli.config import EngineConfig
    eng = VLLMEngine.from_config(str(tiny_path), EngineConfig(max_num_seqs=8), max_model_len=MAX_LEN,
                                 seed=0, kv_cache_tokens=4096, scheduling_policy="priority")
    eng.pause_mode = "keep"
    yield eng
    eng.shutdown()


def _perturbed(original):
    """Other weights in every layer (so the KV of a prefix differs) and a flipped head."""
    import torch
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, w in original.items():
        if name == "lm_head.weight":
            out[name] = -w
        elif ".layers." in name and w.dim() == 2:
            out[name] = w + 0.5 * w.abs().mean() * torch.randn(w.shape, generator=gen, dtype=w.dtype)
        else:
            out[name] = w
    return out


async def test_a_kept_request_continues_on_the_new_weights_with_its_prefix_recomputed(engine, tiny_path):
    import asyncio

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from rstar2_cli.rollout.weight_sync.chunked import push_weights

    prompt = AutoTokenizer.from_pretrained(tiny_path).encode("What is 12 + 30? Let me compute it with Python.")
    n = MAX_LEN - len(prompt) - 8
    long = GenRequest(prompt, max_tokens=n, temperature=0.0, ignore_eos=True, priority=1)
    old = await engine.generate(long)
    v0 = engine.weights_version
    assert old.version_spans == [(0, v0)]                # one version, labelled "default" by vLLM
    running = asyncio.create_task(engine.generate(long))
    await asyncio.sleep(0.5)
    await engine.pause_for_update()                      # "keep": returns at a step boundary
    assert not running.done(), "the request finished before the pause: make it longer"
    original = load_file(str(tiny_path / "model.safetensors"))
    await push_weights([engine], _perturbed(original).items(), paused=True)
    await engine.resume_after_update()
    got = await running
    (s0, a), (cut, b) = got.version_spans
    assert (s0, a, b) == (0, v0, v0 + 1) and 0 < cut < n and got.policy_version == v0
    assert got.token_ids[:cut] == old.token_ids[:cut]    # sampled before the update: the old weights'
    assert got.logprobs[:cut] == pytest.approx(old.logprobs[:cut], abs=1e-4)
    # after it: exactly what the new weights generate from the same prefix, prefilled from scratch
    fresh = await engine.generate(GenRequest(prompt + got.token_ids[:cut], max_tokens=n - cut, temperature=0.0,
                                             ignore_eos=True))
    assert got.token_ids[cut:] == fresh.token_ids
    assert got.logprobs[cut:] == pytest.approx(fresh.logprobs, abs=1e-4)
    assert got.token_ids[cut:] != old.token_ids[cut:]
    await engine.update_weights(original.items())
