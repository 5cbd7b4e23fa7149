"""The numerics checks of benchmarks/gpu/gpu_trainer_proof.py: the sharded load, the chunked
log-prob head, packed attention. Each gathers its figures, then a verdict function (plain numbers
in, CheckFailed out) decides, so a test can show every verdict fail on a perturbed figure.
"""
from __future__ import annotations


import torch

import gpu_smoke
from harness import Stopwatch
from trainer_proof_model import CHUNK_TOKENS, CheckFailed, Context, full, policy_for, reference_model, rows_of
from rstar2_cli.models.attention import LAYOUT_OF
from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.update import logprobs as rl_logprobs
from rstar2_cli.rl.update import model_load
from rstar2_cli.rl.update.loss import clip_higher_loss, loss_stats
from rstar2_cli.rl.update.model_load import DEFAULT_LOAD_METHOD
from rstar2_cli.rollout.trajectory import Trajectory

# bf16: both heads round the same bf16 logits; the reference's head gradient is a bf16 matmul,
# the chunked one accumulates in fp32, hence a percent-level gradient tolerance
TOLERANCE = {torch.bfloat16: {"loss_rel": 1e-2, "logprob_abs": 5e-2, "grad_rel": 5e-2, "packed_mean": 2e-2,
                              "logits_rel": 1e-2},
             torch.float32: {"loss_rel": 1e-5, "logprob_abs": 1e-4, "grad_rel": 1e-4, "packed_mean": 1e-4,
                             "logits_rel": 1e-5}}
# old log-probs of the chunked-head check: the current ones plus uniform noise in +-this, so the
# ratios spread over exp(-0.4)..exp(0.4) = 0.67..1.49 and both Clip-Higher bounds (0.8, 1.28) act
OLD_LOGPROB_SPREAD = 0.4
MIN_CLIP_FRACTION = 0.02   # of the tokens, at each bound: below it the clipped branch is not exercised
# trajectory lengths of the attention check, x budget: two groups of near lengths, so that SDPA's
# padded buckets (rows >= 80 % full, rl/update/packing.py MIN_FILL) and flash-attn's packed rows both hold several
ATTN_FRACTIONS = (0.3, 0.27, 0.24, 0.1, 0.09, 0.08)
LEAK_MARGIN = 5.0      # a leak must move log-probs at least this many times the packing difference


def _mixed_precision():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def sharded_model(ctx: Context):
    """rl/update/model_load.py's sharded build of the checkpoint (meta device, FSDP2 with bf16 compute,
    this rank's safetensors slices, non-persistent buffers recomputed)."""
    return model_load.build_policy_model(str(ctx.checkpoint), sharded=True, device=ctx.device,
                                         mp_policy=_mixed_precision())


# ---------------------------------------------------------------- sharded load


def tensor_differences(ours, reference) -> dict:
    """Every parameter and buffer (rotary inv_freq: not in the checkpoint) of the sharded model
    against the reference: names in one only, tensors not equal (value, dtype). Run on every rank:
    each gathers every parameter (`full_tensor`, a collective in the same order on all ranks) and
    compares it; the counts are the maximum over the ranks."""
    mine = dict(ours.named_parameters()) | dict(ours.named_buffers())
    theirs = dict(reference.named_parameters()) | dict(reference.named_buffers())
    missing = sorted(set(mine) ^ set(theirs))
    differing = []
    for name in sorted(set(mine) & set(theirs)):
        value = full(mine[name].detach())
        expected = theirs[name].detach()
        if value.dtype != expected.dtype or not torch.equal(value.to(expected.device), expected):
            differing.append(name)
    worst = rl_dist.all_reduce_max([float(len(missing)), float(len(differing))], _device_of(ours))
    return {"tensors": len(theirs), "buffers": sum(1 for _ in reference.named_buffers()),
            "names_not_in_both": missing[:3], "differing": differing[:3],
            "names_not_in_both_max_over_ranks": int(worst[0]), "differing_max_over_ranks": int(worst[1])}


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@torch.no_grad()
def forward_differences(ours, reference, ctx: Context) -> dict:
    """One forward pass of random tokens: the sharded model (bf16 compute) against the reference
    with its parameters in bf16 (buffers as they are, as FSDP2's MixedPrecisionPolicy casts only
    parameters) and against the fp32 reference (for scale)."""
    gen = torch.Generator().manual_seed(5)
    n = ctx.sizes["forward_tokens"]
    ids = torch.randint(0, ctx.shape.vocab, (1, n), generator=gen).to(ctx.device)
    pos = torch.arange(n, device=ctx.device)[None]
    run = lambda m: m(input_ids=ids, position_ids=pos, use_cache=False).logits.float()   # noqa: E731
    mine, fp32 = run(ours), run(reference)
    saved = {k: p.data for k, p in reference.named_parameters()}
    try:
        for p in reference.parameters():
            p.data = p.data.to(torch.bfloat16)
        low = run(reference)
    finally:
        for k, p in reference.named_parameters():
            p.data = saved[k]
    return {"forward_tokens": n, "logits_rel_diff": _rel(mine, low), "logits_rel_diff_vs_fp32": _rel(mine, fp32)}


def sharded_load_verdict(figures: dict) -> None:
    tol = TOLERANCE[torch.bfloat16]["logits_rel"]
    problems = []
    if figures["names_not_in_both_max_over_ranks"] or figures["differing_max_over_ranks"]:
        problems.append(f"{figures['differing_max_over_ranks']} tensors differ from from_pretrained (first "
                        f"{figures['differing']}), names not in both: {figures['names_not_in_both']}")
    if not figures["logits_rel_diff"] <= tol:
        problems.append(f"forward: logits differ from the reference's by {figures['logits_rel_diff']:.3g} > {tol}")
    if problems:
        raise CheckFailed("; ".join(problems), figures)


def check_sharded_load(ctx: Context) -> dict:
    with Stopwatch() as load:
        sharded = sharded_model(ctx)
        ctx.sync()
    figures = {"method": DEFAULT_LOAD_METHOD, "load_s": round(load.seconds, 2)}
    reference = reference_model(ctx, ctx.device)
    figures.update(tensor_differences(sharded, reference))
    figures.update(forward_differences(sharded, reference, ctx))
    del reference
    ctx.kept["fsdp"] = sharded          # the chunked-head check runs on it
    sharded_load_verdict(figures)
    figures["tensors_equal"] = True
    return figures


# ---------------------------------------------------------------- chunked head


def head_verdict(figures: dict) -> None:
    tol = TOLERANCE[torch.bfloat16]
    pairs = (("loss_rel_diff", "loss_rel"), ("logprob_max_abs_diff", "logprob_abs"), ("grad_max_rel_diff", "grad_rel"))
    bad = [f"{k} {figures[k]:.3g} > {tol[key]}" for k, key in pairs if not figures[k] <= tol[key]]
    if bad:
        raise CheckFailed(f"beyond the bf16 tolerance: {', '.join(bad)}", figures)
    low, high = figures["clip_frac_low"], figures["clip_frac_high"]
    if min(low, high) < MIN_CLIP_FRACTION:
        raise CheckFailed(f"clipped at the low bound {low:.3f}, at the high bound {high:.3f} of the tokens (each "
                          f"must be >= {MIN_CLIP_FRACTION}): ratios near 1 leave the clipped loss untested", figures)


def check_chunked_head(ctx: Context) -> dict:
    """The chunked head (rl/update/logprobs.py) with the Clip-Higher loss (rl/update/loss.py) against full
    logits, under FSDP2 bf16: loss, log-probs and every gradient, with old log-probs away from the
    current ones (OLD_LOGPROB_SPREAD), so ratios differ from 1 and both clip bounds act."""
    model = ctx.kept.pop("fsdp", None)
    if model is None:
        model = sharded_model(ctx)
    gen = torch.Generator().manual_seed(1)
    n = ctx.sizes["head_tokens"]
    ids = torch.randint(0, ctx.shape.vocab, (1, n + 1), generator=gen).to(ctx.device)
    pos = torch.arange(n + 1, device=ctx.device)[None]
    targets = ids[0, 1:]
    adv = (torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1).to(ctx.device)
    mask = torch.ones(n, device=ctx.device)
    noise = ((torch.rand(n, generator=gen) * 2 - 1) * OLD_LOGPROB_SPREAD).to(ctx.device)
    eps_low, eps_high = 0.2, 0.28            # the recipes' loss.eps_low / eps_high

    def grads() -> dict[str, torch.Tensor]:
        out = {k: full(p.grad).float().cpu() for k, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return out

    hidden = rl_logprobs.final_hidden_states(model, ids, pos)[0, :-1]
    weight = rl_logprobs.head_weight(model)
    with torch.no_grad():
        old = rl_logprobs.token_logprobs(hidden.detach(), weight.detach(), targets, CHUNK_TOKENS)[0] + noise
    loss_of = lambda logp, sl=slice(None): clip_higher_loss(logp, old[sl], adv[sl], mask[sl], float(n),  # noqa: E731
                                                             eps_low, eps_high)
    loss, logp, _ = rl_logprobs.token_logprobs_with_loss(hidden, weight, targets, CHUNK_TOKENS, loss_of)
    loss.backward()
    chunked = grads()
    stats = loss_stats(logp.detach(), old, adv, mask, eps_low, eps_high).as_metrics()
    logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, :-1].float()
    ref_logp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    ref_loss = loss_of(ref_logp)
    ref_loss.backward()
    ref_loss, ref_logp = ref_loss.detach(), ref_logp.detach()
    del logits
    worst, worst_name = 0.0, ""
    for name, g in grads().items():
        err = float((chunked[name] - g).norm() / g.norm().clamp_min(1e-30))
        if err > worst:
            worst, worst_name = err, name
    del model, chunked
    loss = loss.detach()
    figures = {"tokens": n, "loss": float(loss), "loss_rel_diff": abs(float(loss - ref_loss)) / abs(float(ref_loss)),
               "logprob_max_abs_diff": float((logp.detach() - ref_logp).abs().max()),
               "grad_max_rel_diff": worst, "grad_worst_param": worst_name, "ratio_mean": stats["ratio_mean"],
               "clip_frac_low": stats["clip_frac_low"], "clip_frac_high": stats["clip_frac_high"]}
    head_verdict(figures)
    return figures


# ---------------------------------------------------------------- packed attention


def attention_verdict(figures: dict, tol: float) -> None:
    if figures["max_per_micro_batch"] < 2:
        raise CheckFailed("no micro-batch holds two trajectories: nothing was packed", figures)
    if not figures["packed_vs_alone_mean_abs"] <= tol:
        raise CheckFailed(f"packed log-probs differ from each trajectory alone by more than {tol}", figures)
    if figures["leak_mean_abs"] < LEAK_MARGIN * figures["packed_vs_alone_mean_abs"]:
        raise CheckFailed(f"a cross-sequence leak would change log-probs by less than {LEAK_MARGIN}x the "
                          "packing difference: the check cannot tell them apart", figures)


def check_packed_attention(ctx: Context) -> dict:
    """The policy's micro-batches (models/attention.py's kernel, rl/update/packing.py's layout) score each
    trajectory as if alone, well inside what a leak would change (the same trajectory after another)."""
    budget = ctx.sizes["attn_budget"]
    policy = policy_for(ctx, micro_batch_tokens=budget)
    lengths = [max(4, int(budget * f)) for f in ATTN_FRACTIONS]
    batch, _ = gpu_smoke.rollout_batch(lengths, ctx.shape.vocab, seed=2)
    rows = rows_of(policy, batch)
    together = policy.compute_logprobs(batch)
    alone = [policy.compute_logprobs([t])[0] for t in batch]
    first = batch[0]
    after_first = [Trajectory(prompt_id=t.prompt_id, sample_index=t.sample_index,
                              prompt_ids=first.prompt_ids + first.response_ids + t.prompt_ids,
                              response_ids=t.response_ids, loss_mask=t.loss_mask, logprobs=t.logprobs)
                   for t in batch[1:]]
    leaked = [policy.compute_logprobs([t])[0] for t in after_first]
    diff = torch.cat([(a - b).abs() for a, b in zip(together, alone)])
    leak = torch.cat([(a - b).abs() for a, b in zip(leaked, alone[1:])])
    figures = {"attn_implementation": policy.attention.implementation, "layout": policy.layout,
               "dtype": str(policy.dtype).removeprefix("torch."), "sharded": policy.sharded,
               "trajectories": len(batch), "micro_batches": len(rows),
               "max_per_micro_batch": max(len(r.spans) for r in rows),
               "packed_vs_alone_mean_abs": float(diff.mean()), "packed_vs_alone_max_abs": float(diff.max()),
               "leak_mean_abs": float(leak.mean())}
    del policy
    attention_verdict(figures, TOLERANCE[torch.bfloat16 if ctx.cuda else torch.float32]["packed_mean"])
    assert LAYOUT_OF[figures["attn_implementation"]] == figures["layout"]
    return figures
