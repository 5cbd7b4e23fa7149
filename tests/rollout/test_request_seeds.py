"""Which generation requests carry their own sampling seed (`rollout.seed_requests`): auto seeds them
on CPU, where the quickstart, determinism and resume tests rely on it, and not on GPU, where a seed
on a request takes vLLM off its batched sampling path (rollout/generation.py says which path)."""
from __future__ import annotations

import pytest
from api_contracts import assert_call_binds

from rstar2_cli.config import ConfigError, EngineConfig, load_recipe, load_recipe_dict
from rstar2_cli.rollout.engines import VLLMEngine
from rstar2_cli.rollout.generation import GenRequest, sampling_params, seeds_requests


class BuiltEngine(VLLMEngine):
    """What `VLLMEngine.from_config` builds, recorded instead of started: the real AsyncEngineArgs
    and the constructor's keywords; it keeps the two attributes `_sampling_params` reads, as the
    real constructor sets them."""

    def __init__(self, engine_args, **kw):
        self.engine_args, self.kw = engine_args, kw
        self.seed_requests, self.max_model_len = kw["seed_requests"], engine_args.max_model_len


def on_gpu(monkeypatch, gib: float = 79.1) -> None:
    """`from_config`'s GPU branch on this CPU machine: CUDA "available", a card of `gib` GiB."""
    import torch

    from rstar2_cli.rollout import engine_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engine_args, "local_gpu_memory", lambda: (gib, "NVIDIA H100 80GB HBM3"))
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)   # a CPU engine of this session sets it


def test_auto_seeds_requests_on_cpu_only_and_an_explicit_value_wins():
    assert seeds_requests("auto", on_cpu=True) is True
    assert seeds_requests("auto", on_cpu=False) is False
    assert seeds_requests(True, on_cpu=False) is True and seeds_requests(False, on_cpu=True) is False


def test_the_recipes_leave_it_to_the_device():
    from rstar2_cli.rl.run.stages import packaged_recipes

    assert load_recipe(None).rollout.seed_requests == "auto"
    for stage in (1, 2, 3):
        recipe = packaged_recipes() / f"stage{stage}.yaml"
        assert "seed_requests: auto" in recipe.read_text()      # written, with its reason
        assert load_recipe(recipe).rollout.seed_requests == "auto"


def test_a_bad_value_is_one_line_naming_the_field():
    with pytest.raises(ConfigError) as e:
        load_recipe_dict({"rollout": {"seed_requests": "sometimes"}})
    assert str(e.value) == "<recipe>: rollout.seed_requests: Input should be 'auto', True or False (got 'sometimes')"


def test_sampling_params_keep_or_drop_the_seed():
    req = GenRequest([1, 2, 3], max_tokens=8, temperature=1.0, seed=1234)
    assert sampling_params(req, max_model_len=64, seeded=True).seed == 1234
    dropped = sampling_params(req, max_model_len=64, seeded=False)
    assert dropped.seed is None and dropped.temperature == 1.0 and dropped.max_tokens == 8


@pytest.mark.parametrize("setting,seeded", [("auto", False), (True, True)])
def test_the_gpu_path_sends_no_seed_unless_the_recipe_asks(monkeypatch, setting, seeded):
    """The RL path's engine on GPU (rollout/fleet.py `start_engines`: the recipe's engine section, the rollout's
    seed_requests): its SamplingParams carry no seed under auto, so vLLM samples the batch at once."""
    on_gpu(monkeypatch)
    cfg = load_recipe_dict({"rollout": {"seed_requests": setting},
                            "engine": {"gpu_memory_utilization": 0.5, "enforce_eager": False}})
    built = BuiltEngine.from_config("/ckpt/policy", cfg.engine, max_model_len=14336, seed=3, gpu_ids=[0],
                                    seed_requests=cfg.rollout.seed_requests)
    assert_call_binds(VLLMEngine.__init__, built.engine_args, **built.kw)
    assert built.kw["seed_requests"] is seeded
    params = built._sampling_params(GenRequest([5] * 10, max_tokens=100, temperature=1.0, seed=77))
    assert params.seed == (77 if seeded else None)
    assert built.engine_args.seed == 3            # the engine's own seed is set either way


def test_the_cpu_path_keeps_every_requests_seed(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    built = BuiltEngine.from_config("/ckpt/tiny", EngineConfig(), max_model_len=512, seed=0)
    assert built.kw["seed_requests"] is True
    assert built._sampling_params(GenRequest([5] * 10, max_tokens=100, seed=77)).seed == 77
