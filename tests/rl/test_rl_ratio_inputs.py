"""What the ratio is formed from: log-probs of logits / temperature (the distribution the engine
sampled), and a packed row trained without TIS is counted, never silent."""
from __future__ import annotations

import pytest
import torch
from rl_synthetic import make_trajectories

from rstar2_cli.config import ConfigError, LossConfig, ModelConfig, OptimConfig, load_recipe_dict
from rstar2_cli.rl.update.loss import group_advantages
from rstar2_cli.rl.update.policy import PolicyTrainer, loss_positions


def _policy(model_dir, *, temperature: float = 1.0, tis: bool = False) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path=str(model_dir), gradient_checkpointing=False), OptimConfig(lr=1e-3),
                         LossConfig(tis=tis), micro_batch_tokens=4096, temperature=temperature)


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.3])
def test_trainer_log_probs_are_those_of_the_tempered_distribution(tiny_model_dir, temperature):
    policy = _policy(tiny_model_dir, temperature=temperature)
    batch = make_trajectories(3, seed=4)
    got = policy.compute_logprobs(batch)
    for t, lp in zip(batch, got):
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids, use_cache=False).logits[0].float()
        scores = torch.log_softmax(logits / temperature, -1)
        at = torch.arange(len(t.prompt_ids) - 1, len(t.prompt_ids) + len(t.response_ids) - 1)
        expected = scores[at, torch.tensor(t.response_ids)][loss_positions(t)]
        torch.testing.assert_close(lp, expected, atol=1e-5, rtol=1e-5)


def test_a_row_trained_without_tis_is_counted(tiny_model_dir):
    batch = make_trajectories(4, seed=5)
    adv = group_advantages([t.reward + 0.5 * (i % 2) for i, t in enumerate(batch)])
    out = _policy(tiny_model_dir, tis=True).update(batch, adv)
    assert out["tis_off_tokens"] == 0.0
    batch[1].logprobs = []          # one member without the engine's log-probs: its row loses TIS
    out = _policy(tiny_model_dir, tis=True).update(batch, adv)
    assert out["tis_off_tokens"] == sum(int(loss_positions(t).sum()) for t in batch)   # one row here


def test_an_engine_ratio_under_a_nucleus_is_refused_at_load():
    base = {"data": {"train": "x.jsonl"}}
    with pytest.raises(ConfigError, match=r"loss.tis with rollout.top_p=0.9"):
        load_recipe_dict({**base, "loss": {"tis": True}, "rollout": {"top_p": 0.9}})
    with pytest.raises(ConfigError, match=r"rollout.temperature=0: RL samples"):
        load_recipe_dict({**base, "rollout": {"temperature": 0.0}})
    assert load_recipe_dict({**base, "loss": {"tis": True}, "rollout": {"temperature": 0.7}}).loss.tis
