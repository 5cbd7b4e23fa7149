"""Log-probs (and entropy) of chosen tokens from the decoder's last hidden states, in token chunks.

Why: the HF head turns every scored position into a `[tokens, vocab]` row of logits; at Qwen3's
vocabulary (151,936) a 32K-token micro-batch is 19.9 GB per fp32 copy, and log-softmax, entropy
and their backward make several copies. Here only the positions the caller selects (the loss
tokens: tool responses are never scored) go through the LM head, `chunk_tokens` at a time, so
the head's peak is about chunk × vocab × 8 bytes (fp32 logits and their exponentials), not
tokens × vocab × several copies (`benchmarks/timing/bench_logprobs.py` measures both).

Backward without a second pass: the policy loss is a sum of per-token terms (rl/update/loss.py), so
`token_logprobs_with_loss` evaluates the caller's loss on each chunk while the chunk's logits
exist and forms its gradient there: d loss / d logits = g · (onehot(target) − softmax), with
g = d loss / d logprob of each token. The gradients of the hidden states [tokens, H] and of the
head weight [V, H] (accumulated in fp32) are kept; backward only scales them by the incoming
gradient. That is the same three head matmuls as the full-logits path (logits, d hidden,
d weight), where checkpointing each chunk would add a fourth (recomputing the logits).

Model contract: the causal-LM forward is `lm_head(model.model(...).last_hidden_state)` with no
logit scaling or soft-capping and no head bias; true for `PLAIN_HEAD_MODEL_TYPES` (their
`modeling_*.py` forward in transformers 5.19: the final norm is inside `model.model`), checked by
`head_weight`. Tied embeddings need nothing: `lm_head.weight` is then the embedding matrix itself,
and its gradient reaches the one shared parameter.

FSDP2: the hidden states come from the root module's own forward (a forward hook on the decoder,
the head applied to no position via an empty `logits_to_keep`), so FSDP2's root hooks all-gather
the embedding, final norm and head. `fully_shard` does not reshard the root after forward (its
default for the root module), so `lm_head.weight` read after the forward is the full parameter
until backward's final callback reduce-scatters its gradient (torch 2.13
`_fsdp_state.FSDPState._root_post_backward_final_callback`). `tests/rl/test_rl_fsdp.py` checks
that 2 ranks reproduce the 1-rank update.
"""
from __future__ import annotations

from typing import Callable

import torch

PLAIN_HEAD_MODEL_TYPES = ("qwen2", "qwen3", "llama")

# (logprobs of one chunk, requiring grad; the chunk's slice of the scored tokens) -> its loss term
TokenLoss = Callable[[torch.Tensor, slice], torch.Tensor]


def final_hidden_states(model, input_ids: torch.Tensor, position_ids: torch.Tensor, **attn_kwargs) -> torch.Tensor:
    """The decoder's last hidden states [1, L, H] (after the final norm), through the model's forward.
    `attn_kwargs` reach every attention call (flash-attn's `cu_seq_lens_q/k`, `max_length_q/k`)."""
    seen: list[torch.Tensor] = []
    handle = model.model.register_forward_hook(lambda _module, _args, out: seen.append(out[0]))
    try:
        model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
              logits_to_keep=torch.zeros(0, dtype=torch.long, device=input_ids.device), **attn_kwargs)
    finally:
        handle.remove()
    return seen[0]


def head_weight(model) -> torch.Tensor:
    """The LM head's weight [V, H]; under FSDP2 call it after the forward (the full parameter then)."""
    model_type = getattr(model.config, "model_type", None)
    head = model.get_output_embeddings()
    if model_type not in PLAIN_HEAD_MODEL_TYPES or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError(f"model_type {model_type!r}: the chunked log-prob head supports models whose logits are "
                         f"lm_head(last hidden state) with no bias or scaling: {', '.join(PLAIN_HEAD_MODEL_TYPES)}")
    return head.weight


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The head matmul's dtype: autocast's where it is on (as `lm_head` under autocast), else the weight's."""
    kind = weight.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else weight.dtype


def _chunk_scores(h: torch.Tensor, w: torch.Tensor, tgt: torch.Tensor, with_entropy: bool):
    """One chunk: (log p(target), entropy or None, exp(logits − max), Σ exp(logits − max))."""
    z = (h @ w.T).float()
    z.sub_(z.amax(-1, keepdim=True))                          # z = logits − max
    e = z.exp()
    total = e.sum(-1)
    log_total = total.log()                                   # logsumexp − max
    logp = z.gather(1, tgt)[:, 0] - log_total
    entropy = log_total - z.mul_(e).sum(-1) / total if with_entropy else None   # logsumexp − Σ p·logits
    return logp, entropy, e, total


def _chunk_gradients(e: torch.Tensor, total: torch.Tensor, g: torch.Tensor, tgt: torch.Tensor,
                     h: torch.Tensor, w: torch.Tensor, grad_w: torch.Tensor) -> torch.Tensor:
    """d loss / d logits = g · (onehot(target) − softmax), formed in `e`'s memory; adds the chunk's
    weight gradient to `grad_w` (fp32) and returns its hidden-state gradient."""
    e.mul_((-g / total)[:, None]).scatter_add_(1, tgt, g[:, None])
    d_logits = e.to(h.dtype)
    if grad_w.dtype == h.dtype:
        grad_w.addmm_(d_logits.T, h)
    else:
        grad_w += d_logits.T @ h
    return d_logits @ w


class _ChunkedHead(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], targets [N]) -> (loss, logprobs [N], entropy [N] or [0])."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens: int, token_loss: TokenLoss | None,
                with_entropy: bool, dtype: torch.dtype):
        n, device = hidden.shape[0], hidden.device
        h, w = hidden.detach().to(dtype), weight.detach().to(dtype)
        logp = torch.empty(n, dtype=torch.float32, device=device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=device)
        loss = torch.zeros((), dtype=torch.float32, device=device)
        grad_h = torch.empty_like(hidden) if token_loss is not None else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=device) if token_loss is not None else None
        with torch.autocast(device_type=device.type, enabled=False):
            for start in range(0, n, chunk_tokens):
                sl = slice(start, min(start + chunk_tokens, n))
                tgt = targets[sl, None]
                logp[sl], entropy_c, e, total = _chunk_scores(h[sl], w, tgt, with_entropy)
                if with_entropy:
                    entropy[sl] = entropy_c
                if token_loss is not None:
                    with torch.enable_grad():
                        lp = logp[sl].clone().requires_grad_(True)
                        piece = token_loss(lp, sl)
                        (g,) = torch.autograd.grad(piece, lp)
                    loss += piece.detach()
                    grad_h[sl] = _chunk_gradients(e, total, g, tgt, h[sl], w, grad_w)
                del e                  # before the next chunk's logits exist
        ctx.grads = (grad_h, None if grad_w is None else grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(logp, entropy)
        return loss, logp, entropy

    @staticmethod
    def backward(ctx, grad_loss, _grad_logp, _grad_entropy):
        if ctx.grads is None:
            raise RuntimeError(
                "a second backward through the chunked log-prob head (its gradients are scaled in place)"
            )
        grad_h, grad_w = ctx.grads
        ctx.grads = None
        need_h, need_w = ctx.needs_input_grad[:2]
        return (grad_h.mul_(grad_loss) if need_h else None, grad_w.mul_(grad_loss) if need_w else None,
                None, None, None, None, None)


def _check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int) -> None:
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1] or weight.shape[1:] != hidden.shape[1:]:
        raise ValueError(f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, targets "
                         f"{tuple(targets.shape)}: expected [N, H], [V, H], [N]")


@torch.no_grad()
def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) per token (fp32) and, with `with_entropy`, the entropy of each next-token
    distribution; hidden [N, H] final hidden states, weight [V, H] the LM head. No gradient."""
    _check(hidden, weight, targets, chunk_tokens)
    _, logp, entropy = _ChunkedHead.apply(hidden, weight, targets, chunk_tokens, None, with_entropy,
                                          _compute_dtype(weight))
    return logp, (entropy if with_entropy else None)


def token_logprobs_with_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             chunk_tokens: int, token_loss: TokenLoss,
                             with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(loss, logprobs, entropy): as `token_logprobs`, plus loss = Σ over chunks of
    `token_loss(chunk logprobs, chunk slice)`, differentiable w.r.t. `hidden` and `weight`.

    `token_loss` must be a sum of per-token terms (each token's term depends on its own log-prob
    only), as `rl.loss.clip_higher_loss` is; the log-probs and entropy come back detached.
    """
    _check(hidden, weight, targets, chunk_tokens)
    loss, logp, entropy = _ChunkedHead.apply(hidden, weight, targets, chunk_tokens, token_loss, with_entropy,
                                             _compute_dtype(weight))
    return loss, logp, (entropy if with_entropy else None)
