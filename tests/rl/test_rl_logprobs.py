"""The chunked log-prob head (rl/update/logprobs.py) gives the full-logits path's log-probs, entropy, loss
and parameter gradients on a tiny Qwen3 with packed rows and tool-response gaps, for any chunk
size; and the update skips the old-log-prob pass exactly where that changes nothing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from rl_synthetic import build_tiny_model, make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.rl.update.logprobs import final_hidden_states, head_weight, token_logprobs, token_logprobs_with_loss
from rstar2_cli.rl.update.loss import clip_higher_loss, tis_weights
from rstar2_cli.rl.update.packing import pack_sequences
from rstar2_cli.rl.update.policy import PolicyTrainer, loss_positions

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "timing"))
from bench_logprobs import full_logits_logprobs  # noqa: E402

EPS_LOW, EPS_HIGH = 0.2, 0.28
BUDGET = 120                     # packs several trajectories per row
CHUNKS = (1, 7, 10_000)          # one token, a few, more than any row


def _batch():
    batch = make_trajectories(10, seed=3)
    batch[4].loss_mask = [0] * len(batch[4].response_ids)        # nothing of it is scored
    return batch


def _row_tensors(batch, row, gen):
    """Per response token of the row (span after span): mask, old log-probs (random, so the ratio
    moves and clips), advantages."""
    mask = torch.cat([torch.tensor(batch[s.index].loss_mask, dtype=torch.float32) for s in row.spans])
    old = -torch.rand(mask.shape[0], generator=gen) * 6
    adv = torch.cat([torch.full((s.response_len,), float(s.index % 3) - 1.0) for s in row.spans])
    return mask, old, adv


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _full_path(model, rows, per_row, global_tokens):
    """The full-logits path: every response position's logits, masked afterwards."""
    model.zero_grad(set_to_none=True)
    total, logps, ents = 0.0, [], []
    for row, (mask, old, adv) in zip(rows, per_row):
        logits = model(input_ids=row.input_ids, position_ids=row.position_ids, logits_to_keep=row.logit_positions(),
                       use_cache=False).logits[0]
        logp, ent = full_logits_logprobs(logits, row.target_ids())
        loss = clip_higher_loss(logp, old, adv, mask, global_tokens, EPS_LOW, EPS_HIGH, dual_clip=3.0)
        loss.backward()
        total += float(loss.detach())
        logps.append(logp.detach()[mask != 0])
        ents.append(ent[mask != 0])
    return torch.cat(logps), torch.cat(ents), total, _grads(model)


def _chunked_path(model, rows, per_row, global_tokens, chunk):
    model.zero_grad(set_to_none=True)
    total, logps, ents = 0.0, [], []
    for row, (mask, old, adv) in zip(rows, per_row):
        keep = mask != 0
        hidden = final_hidden_states(model, row.input_ids, row.position_ids)[0, row.logit_positions()[keep]]
        m, o, a = mask[keep], old[keep], adv[keep]

        def token_loss(lp, sl, m=m, o=o, a=a):
            return clip_higher_loss(lp, o[sl], a[sl], m[sl], global_tokens, EPS_LOW, EPS_HIGH, dual_clip=3.0)

        loss, logp, ent = token_logprobs_with_loss(hidden, head_weight(model), row.target_ids()[keep], chunk,
                                                   token_loss, with_entropy=True)
        loss.backward()
        total += float(loss.detach())
        logps.append(logp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents), total, _grads(model)


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_head_equals_full_logits(tied):
    model = build_tiny_model(tie_word_embeddings=tied)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    batch = _batch()
    rows = pack_sequences([(t.prompt_ids, t.response_ids) for t in batch], BUDGET)
    assert any(len(r.spans) >= 2 for r in rows) and any(0 in t.loss_mask for t in batch)
    gen = torch.Generator().manual_seed(0)
    per_row = [_row_tensors(batch, row, gen) for row in rows]
    global_tokens = sum(float(m.sum()) for m, _, _ in per_row)
    ref_logp, ref_ent, ref_loss, ref_grads = _full_path(model, rows, per_row, global_tokens)
    assert ref_logp.shape == (sum(sum(t.loss_mask) for t in batch),)
    for chunk in CHUNKS:
        logp, ent, loss, grads = _chunked_path(model, rows, per_row, global_tokens, chunk)
        torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=0)
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        assert grads.keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-4, msg=f"{name}, chunk {chunk}")


def test_no_grad_log_probs_equal_the_loss_pass():
    torch.manual_seed(1)
    hidden, weight = torch.randn(9, 8), torch.randn(50, 8)
    targets = torch.randint(0, 50, (9,))
    plain, _ = token_logprobs(hidden, weight, targets, 4)
    _, with_loss, _ = token_logprobs_with_loss(hidden.requires_grad_(True), weight, targets, 4,
                                               lambda lp, sl: lp.sum())
    assert torch.equal(plain, with_loss)


def test_no_scored_token_gives_zero_gradients():
    """A row whose tokens are all tool responses still backpropagates (FSDP ranks stay in step)."""
    hidden = torch.randn(0, 8, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(50, 8))
    loss, logp, entropy = token_logprobs_with_loss(hidden, weight, torch.zeros(0, dtype=torch.long), 4,
                                                   lambda lp, sl: lp.sum(), with_entropy=True)
    loss.backward()
    assert float(loss.detach()) == 0.0 and logp.shape == entropy.shape == (0,)
    assert hidden.grad.shape == (0, 8) and torch.equal(weight.grad, torch.zeros(50, 8))


def test_bf16_autocast_head_matches_the_autocast_full_path():
    """Under autocast the head multiplies in bf16, as `lm_head` does; the weight gradient is fp32."""
    torch.manual_seed(2)
    hidden0, targets = torch.randn(12, 16), torch.randint(0, 64, (12,))
    weight = torch.nn.Parameter(torch.randn(64, 16) * 0.3)
    results = []
    for chunk in (None, 5):
        weight.grad = None
        hidden = hidden0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if chunk is None:
                logp, _ = full_logits_logprobs(torch.nn.functional.linear(hidden, weight), targets)
                loss = logp.sum()
            else:
                loss, logp, _ = token_logprobs_with_loss(hidden, weight, targets, chunk, lambda lp, sl: lp.sum())
        loss.backward()
        results.append((logp.detach(), hidden.grad, weight.grad))
    assert results[1][2].dtype == torch.float32
    for ref, got in zip(*results):
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_head_weight_refuses_models_with_other_heads():
    model = build_tiny_model()
    model.config.model_type = "gemma2"          # soft-capped logits: lm_head alone is not its logits
    with pytest.raises(ValueError, match="chunked log-prob head"):
        head_weight(model)


# ------------------------------------------------------------ the update


def _policy(chunk: int = 1024, max_staleness: int = 0, mini_batches: int = 1,
            loss: LossConfig | None = None) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False), OptimConfig(lr=1e-3, warmup_steps=0),
                         loss or LossConfig(tis=True), micro_batch_tokens=BUDGET, ppo_mini_batches=mini_batches,
                         model=build_tiny_model(), logprob_chunk_tokens=chunk, max_staleness=max_staleness)


def _update(policy: PolicyTrainer, batch, adv):
    """update()'s metrics, the gradients of its first optimizer step and its old-log-prob passes."""
    grads: dict[str, torch.Tensor] = {}
    passes = []
    proximal = policy.compute_logprobs

    def counted(b):
        passes.append(len(b))
        return proximal(b)

    policy.optimizer.register_step_pre_hook(lambda *_: None if grads else grads.update(_grads(policy.model)))
    policy.compute_logprobs = counted
    return policy.update(batch, adv), grads, passes


def _reference_update_grads(batch, adv, cap, old_from_rollout: bool = False):
    """The full-logits update with ratio 1 (old = current), TIS against the rollout log-probs; or,
    `old_from_rollout`, with the rollout log-probs as the old policy and no TIS."""
    model = build_tiny_model()
    rows = pack_sequences([(t.prompt_ids, t.response_ids) for t in batch], BUDGET)
    global_tokens = float(sum(sum(t.loss_mask) for t in batch))
    ents, masks = [], []
    for row in rows:
        logits = model(input_ids=row.input_ids, position_ids=row.position_ids, logits_to_keep=row.logit_positions(),
                       use_cache=False).logits[0]
        logp, ent = full_logits_logprobs(logits, row.target_ids())
        mask = torch.cat([torch.tensor(batch[s.index].loss_mask, dtype=torch.float32) for s in row.spans])
        rollout = torch.cat([torch.tensor(batch[s.index].logprobs) for s in row.spans])
        a = torch.cat([torch.full((s.response_len,), adv[s.index]) for s in row.spans])
        old = rollout if old_from_rollout else logp.detach()
        clip_higher_loss(logp, old, a, mask, global_tokens, EPS_LOW, EPS_HIGH,
                         tis=None if old_from_rollout else tis_weights(old, rollout, cap)).backward()
        ents.append(ent)
        masks.append(mask)
    entropy = float((torch.cat(ents) * torch.cat(masks)).sum() / global_tokens)
    return _grads(model), entropy


@pytest.mark.parametrize("chunk", [1, 10_000])
def test_update_gradients_equal_the_full_logits_update(chunk):
    batch, adv = _batch(), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, -0.1, 1.5, -1.5]
    stats, grads, _ = _update(_policy(chunk=chunk), batch, adv)
    ref_grads, ref_entropy = _reference_update_grads(batch, adv, LossConfig().tis_cap)
    assert stats["entropy"] == pytest.approx(ref_entropy, abs=1e-5)
    assert stats["loss_tokens"] == sum(sum(t.loss_mask) for t in batch)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-4, msg=name)


def test_skipping_the_old_log_prob_pass_changes_no_loss_or_gradient():
    """One mini-batch, synchronous: the update's own detached log-probs are the old ones; the loss,
    every gradient and the TIS / vLLM-difference metrics equal those with the separate pass."""
    batch, adv = _batch(), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, -0.1, 1.5, -1.5]
    skipped, with_pass = _policy(), _policy(max_staleness=1)   # staleness >= 1 keeps the pass
    assert skipped.reuses_update_logprobs and not with_pass.reuses_update_logprobs
    s_stats, s_grads, s_passes = _update(skipped, batch, adv)
    p_stats, p_grads, p_passes = _update(with_pass, batch, adv)
    assert s_passes == [] and p_passes == [len(batch)]
    assert s_stats["loss"] == p_stats["loss"] and s_stats["ratio_mean"] == p_stats["ratio_mean"] == 1.0
    for key in ("tis_weight_mean", "tis_capped_frac", "logprob_abs_diff_vllm", "entropy", "grad_norm"):
        assert s_stats[key] == p_stats[key], key
    assert s_grads.keys() == p_grads.keys()
    for name, g in p_grads.items():
        assert torch.equal(s_grads[name], g), name


def test_more_than_one_mini_batch_keeps_the_old_log_prob_pass():
    policy = _policy(mini_batches=2)
    assert not policy.reuses_update_logprobs
    batch = _batch()
    stats, _, passes = _update(policy, batch, [1.0, -1.0] * 5)
    assert passes == [len(batch)] and stats["optimizer_steps"] == 2
    assert stats["ratio_mean"] != 1.0            # the second mini-batch ran on moved weights


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_rollout_old_logprobs_clip_against_the_engine_with_no_extra_pass(max_staleness):
    """loss.old_logprobs: rollout: the ratio is pi_theta / pi_rollout (the engine's sampling log-probs,
    random here, so it moves and clips), the gradients equal the full-logits reference with those
    as the old policy, and no proximal pass runs at any staleness."""
    batch, adv = _batch(), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, -0.1, 1.5, -1.5]
    policy = _policy(max_staleness=max_staleness, loss=LossConfig(old_logprobs="rollout"))
    stats, grads, passes = _update(policy, batch, adv)
    assert passes == []
    assert stats["ratio_mean"] != 1.0 and stats["clip_frac"] > 0 and stats["tis_weight_mean"] == 1.0
    ref_grads, _ = _reference_update_grads(batch, adv, None, old_from_rollout=True)
    assert grads.keys() == ref_grads.keys()
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, atol=1e-6, rtol=1e-4, msg=name)


def test_rollout_old_logprobs_name_the_trajectory_without_them():
    batch = _batch()
    batch[2].logprobs = batch[2].logprobs[:-1]
    with pytest.raises(ValueError, match=rf"trajectory {batch[2].prompt_id}#{batch[2].sample_index} has "
                                         rf"{len(batch[2].response_ids) - 1} for {len(batch[2].response_ids)} tokens"):
        _policy(loss=LossConfig(old_logprobs="rollout")).update(batch, [1.0] * len(batch))


def test_loss_positions_follow_the_mask():
    t = make_trajectories(2, seed=0)[1]
    assert loss_positions(t).tolist() == [m != 0 for m in t.loss_mask]
    t.loss_mask = t.loss_mask[:-1]
    with pytest.raises(ValueError, match="loss_mask has"):
        loss_positions(t)
