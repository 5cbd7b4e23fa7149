"""Packed rows under flash-attn get their sequence boundaries from the host (`cu_seq_lens_q/k` and
integer `max_length_q/k`), so transformers never derives them on the device; SDPA gets nothing new.

flash-attn itself needs a GPU, so a registered stand-in attention runs each `cu_seq_lens` segment
through SDPA alone: right boundaries give the per-sequence log-probs, wrong ones do not."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rl_synthetic import build_tiny_model, make_trajectories
from transformers import AttentionInterface

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.models.attention import AttentionChoice
from rstar2_cli.rl.update.packing import pack_sequences, pad_sequences
from rstar2_cli.rl.update.policy import PolicyTrainer

VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
SEEN: list[dict] = []


def segment_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """flash-attn varlen's semantics on CPU: causal attention within each `cu_seq_lens_q` segment."""
    SEEN.append({k: kwargs.get(k) for k in VARLEN_KEYS})
    cu = kwargs["cu_seq_lens_q"].tolist()
    outs = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                           scale=scaling, enable_gqa=True) for a, b in zip(cu[:-1], cu[1:])]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register("segment_sdpa", segment_attention)


def _policy(layout: str) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path="unused", gradient_checkpointing=False), OptimConfig(), LossConfig(),
                         micro_batch_tokens=120, model=build_tiny_model(), attn_implementation="sdpa", layout=layout)


def _alone(model, t) -> torch.Tensor:
    """Log-probs of `t`'s loss tokens with `t` alone in the forward (plain SDPA)."""
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    p = len(t.prompt_ids)
    lp = logp[p - 1:-1].gather(-1, torch.tensor(t.response_ids)[:, None])[:, 0]
    return lp[torch.tensor(t.loss_mask) != 0]


def test_varlen_kwargs_of_a_packed_row_are_its_boundaries_on_the_host():
    row = pack_sequences([([1, 2], [3]), ([4], [5, 6, 7, 8]), ([9, 9, 9], [1])], budget=100)[0]
    kw = row.varlen_kwargs("cpu")
    lengths = [s.prompt_len + s.response_len for s in row.spans]
    assert kw["cu_seq_lens_q"].dtype == torch.int32 and kw["cu_seq_lens_q"] is kw["cu_seq_lens_k"]
    assert kw["cu_seq_lens_q"].tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert kw["cu_seq_lens_q"].tolist()[-1] == row.input_ids.shape[1]
    assert type(kw["max_length_q"]) is int and kw["max_length_q"] == kw["max_length_k"] == max(lengths) == 5
    padded = pad_sequences([([1, 2], [3]), ([4], [5, 6])], budget=100)[0]
    with pytest.raises(ValueError, match="packed"):
        padded.varlen_kwargs("cpu")


def test_flash_path_passes_host_boundaries_to_every_attention_call():
    policy = _policy("packed")
    # what resolve_attention picks on a GPU with flash-attn; the kernel itself is the CPU stand-in
    policy.attention = AttentionChoice("flash_attention_2", "packed", "test")
    policy.model.set_attn_implementation("segment_sdpa")
    batch = make_trajectories(10, seed=3)
    rows = policy._rows(batch)
    assert any(len(r.spans) >= 2 for r in rows)
    SEEN.clear()
    packed = policy.compute_logprobs(batch)
    layers = policy.model.config.num_hidden_layers
    assert len(SEEN) == layers * len(rows)
    for r, row in enumerate(rows):
        want = row.varlen_kwargs("cpu")
        for call in SEEN[r * layers:(r + 1) * layers]:
            assert call["cu_seq_lens_q"].tolist() == call["cu_seq_lens_k"].tolist() == want["cu_seq_lens_q"].tolist()
            assert call["max_length_q"] == call["max_length_k"] == want["max_length_q"]
            assert type(call["max_length_q"]) is int
    policy.model.set_attn_implementation("sdpa")
    for t, lp in zip(batch, packed):
        torch.testing.assert_close(lp, _alone(policy.model, t), atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_sdpa_forward_gets_no_varlen_kwargs(layout):
    policy = _policy(layout)
    seen = []
    policy.model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(set(kwargs)), with_kwargs=True)
    policy.compute_logprobs(make_trajectories(6, seed=1))
    assert seen and not any(k in keys for keys in seen for k in VARLEN_KEYS)
