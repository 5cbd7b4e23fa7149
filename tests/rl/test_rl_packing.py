"""Micro-batches in either layout must score every loss token, and give the same gradients, as if
each sequence ran alone; and the attention kernel is chosen so that no token attends across them."""
from __future__ import annotations

import pytest
import torch
from rl_synthetic import build_tiny_model, make_trajectories

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.models.attention import choose_attention
from rstar2_cli.rl.update.logprobs import final_hidden_states, head_weight, token_logprobs_with_loss
from rstar2_cli.rl.update.packing import LAYOUTS, micro_batches, pack_sequences, pad_sequences, plan_bins, plan_buckets
from rstar2_cli.rl.update.policy import PolicyTrainer


def test_plan_bins_respects_budget_and_isolates_long_sequences():
    bins = plan_bins([30, 10, 25, 5, 90, 20], budget=50)
    lengths = [30, 10, 25, 5, 90, 20]
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert [4] in bins                                     # longer than the budget: alone
    assert all(sum(lengths[i] for i in b) <= 50 for b in bins if b != [4])


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="empty prompt_ids"):
        pack_sequences([([], [1, 2])], 10)


def test_an_unsized_auto_budget_is_one_clear_error():
    """A recipe loaded without its device keeps micro_batch_tokens "auto" (config.py): packing names it."""
    with pytest.raises(ValueError, match=r"micro_batch_tokens must be a number, got 'auto'"):
        micro_batches([([1], [2])], "auto", "packed")


def _reference_logprobs(model, t):
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    p = len(t.prompt_ids)
    return logp[p - 1:-1].gather(-1, torch.tensor(t.response_ids)[:, None])[:, 0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_logprobs_equal_per_sequence_logprobs(layout):
    model = build_tiny_model()
    batch = make_trajectories(10, seed=3)
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False), OptimConfig(), LossConfig(),
                           micro_batch_tokens=120, model=model, layout=layout)
    rows = policy._rows(batch)
    assert any(len(r.spans) >= 2 for r in rows), "the test must actually put several sequences in a micro-batch"
    assert any(0 in t.loss_mask for t in batch), "the test must have tool-response (unscored) tokens"
    packed = policy.compute_logprobs(batch)
    for t, lp in zip(batch, packed):
        assert lp.shape == (sum(t.loss_mask),)           # loss positions only
        keep = torch.tensor(t.loss_mask) != 0
        torch.testing.assert_close(lp, _reference_logprobs(model, t)[keep], atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_micro_batch_budget_does_not_change_the_update(layout):
    """Token-level normalisation over the whole step: many small micro-batches == one big one."""
    batch = make_trajectories(8, seed=5)
    adv = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.1, -0.1]
    results = []
    for budget in (40, 10_000):
        policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False),
                               OptimConfig(lr=1e-3, warmup_steps=0), LossConfig(), micro_batch_tokens=budget,
                               model=build_tiny_model(), layout=layout)
        rows = len(policy._rows(batch))
        stats = policy.update(batch, adv)
        results.append((rows, stats, dict(policy.full_state_dict())))
    (rows_small, s_small, p_small), (rows_big, s_big, p_big) = results
    assert rows_small > 2 and rows_small > rows_big and (layout == "padded" or rows_big == 1)
    assert s_small["loss"] == pytest.approx(s_big["loss"], abs=1e-6)
    assert s_small["grad_norm"] == pytest.approx(s_big["grad_norm"], rel=1e-5)
    for name in p_big:
        torch.testing.assert_close(p_small[name], p_big[name], atol=1e-4, rtol=0)   # Adam: ~lr/|g| noise


def test_plan_buckets_bound_padding_and_budget():
    lengths = [30, 10, 25, 5, 90, 20, 29, 24]
    buckets = plan_buckets(lengths, budget=80, min_fill=0.8)
    assert sorted(i for b in buckets for i in b) == list(range(8))
    assert [4] in buckets                                  # longer than the budget: alone
    for b in buckets:
        longest = lengths[b[0]]
        assert all(lengths[i] <= longest for i in b)       # the first member sets the row width
        assert len(b) == 1 or len(b) * longest <= 80
        assert all(lengths[i] >= 0.8 * longest for i in b)


def test_padded_rows_have_no_restarting_positions():
    """Padded rows keep 0..L-1 positions, so transformers sees no packing and builds no mask."""
    seqs = [([1, 2], [3, 4, 5]), ([6], [7, 8, 9, 10]), ([11, 12, 13], [14])]
    rows = pad_sequences(seqs, budget=100, min_fill=0.0)
    assert len(rows) == 1 and tuple(rows[0].input_ids.shape) == (3, 5)
    assert torch.equal(rows[0].position_ids, torch.arange(5).expand(3, 5))
    for s in rows[0].spans:
        p, r = seqs[s.index]
        assert rows[0].input_ids[s.row, :len(p) + len(r)].tolist() == p + r
    assert rows[0].target_ids().tolist() == [r for s in rows[0].spans for r in seqs[s.index][1]]


def _weighted_logprob_grads(model, batch, weights, layout):
    """(log-probs per sequence, parameter gradients) of sum(w * log p) over every loss token."""
    model.zero_grad(set_to_none=True)
    keep = [torch.tensor(t.loss_mask) != 0 for t in batch]
    out = [None] * len(batch)
    for row in micro_batches([(t.prompt_ids, t.response_ids) for t in batch], 120, layout):
        select = torch.cat([keep[s.index] for s in row.spans])
        w = torch.cat([weights[s.index][keep[s.index]] for s in row.spans])
        hidden = final_hidden_states(model, row.input_ids, row.position_ids)
        h = hidden.reshape(-1, hidden.shape[-1])[row.logit_positions()[select]]
        loss, logp, _ = token_logprobs_with_loss(h, head_weight(model), row.target_ids()[select], 7,
                                                 lambda lp, sl: (w[sl] * lp).sum())
        loss.backward()
        for s, piece in zip(row.spans, logp.split([int(keep[s.index].sum()) for s in row.spans])):
            out[s.index] = piece
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _reference_grads(model, batch, weights):
    """Each sequence alone, full logits, no position ids: the unpacked reference."""
    model.zero_grad(set_to_none=True)
    out = []
    for t, w in zip(batch, weights):
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        p = len(t.prompt_ids)
        lp = logp[p - 1:-1].gather(-1, torch.tensor(t.response_ids)[:, None])[:, 0]
        keep = torch.tensor(t.loss_mask) != 0
        (w[keep] * lp[keep]).sum().backward()
        out.append(lp[keep].detach())
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_logprobs_and_gradients_equal_unpacked_reference(layout):
    """Mixed lengths (5 to 90 response tokens), several per micro-batch, tool-response gaps."""
    model = build_tiny_model()
    batch = make_trajectories(12, seed=11, min_len=5, max_len=90)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(len(t.response_ids), generator=gen) for t in batch]
    rows = micro_batches([(t.prompt_ids, t.response_ids) for t in batch], 120, layout)
    assert any(len(r.spans) >= 2 for r in rows) and len(rows) < len(batch)
    got, grads = _weighted_logprob_grads(model, batch, weights, layout)
    ref, ref_grads = _reference_grads(model, batch, weights)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("requested, device, dtype, flash, expected", [
    ("auto", "cuda", torch.bfloat16, True, ("flash_attention_2", "packed")),
    ("auto", "cuda", torch.bfloat16, False, ("sdpa", "padded")),     # no flash-attn: never a packed row
    ("auto", "cuda", torch.float32, True, ("sdpa", "padded")),       # flash-attn has no fp32 kernel
    ("auto", "cpu", torch.float32, False, ("sdpa", "padded")),
    ("sdpa", "cuda", torch.bfloat16, True, ("sdpa", "padded")),
    ("flash_attention_2", "cuda", torch.float16, True, ("flash_attention_2", "packed")),
])
def test_attention_choice(requested, device, dtype, flash, expected):
    choice = choose_attention(requested, device, dtype, flash)
    assert (choice.implementation, choice.layout) == expected and choice.reason


@pytest.mark.parametrize("device, dtype, flash, why", [
    ("cpu", torch.bfloat16, True, "CUDA/ROCm"), ("cuda", torch.bfloat16, False, "flash-attn"),
    ("cuda", torch.float32, True, "bfloat16"),
])
def test_flash_attention_that_cannot_run_is_refused(device, dtype, flash, why):
    with pytest.raises(ValueError, match=f"flash_attention_2.*{why}"):
        choose_attention("flash_attention_2", device, dtype, flash)


def test_cpu_policy_uses_sdpa_over_padded_rows():
    policy = PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False), OptimConfig(), LossConfig(),
                           micro_batch_tokens=120, model=build_tiny_model())
    assert policy.layout == "padded" and policy.model.config._attn_implementation == "sdpa"
