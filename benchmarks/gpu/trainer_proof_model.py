"""The numerics checks of benchmarks/gpu/gpu_trainer_proof.py (sharded load, chunked head, packed
attention) and what every check shares: the sizes, the random model, the policy built on it.

Only torch, transformers and this source tree are imported (a bare GPU box has no vLLM).
"""
from __future__ import annotations

import gc
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

import gpu_smoke
import smoke_model as sm
from rstar2_cli.launch.model_shape import QWEN3_14B
from rstar2_cli.models.attention import LAYOUT_OF

WIDTHS = {"14b": QWEN3_14B, "small": replace(sm.TINY, tie_embeddings=False)}
# per widths: tokens of the chunked-head check, micro-batch budget of the attention check
SIZES = {"14b": {"head_tokens": 4096, "attn_budget": 4096}, "small": {"head_tokens": 48, "attn_budget": 96}}
# trajectory lengths of the attention check, x budget: two groups of near lengths, so that SDPA's
# padded buckets (rows >= 80 % full, rl/packing.py MIN_FILL) and flash-attn's packed rows both hold several
ATTN_FRACTIONS = (0.3, 0.27, 0.24, 0.1, 0.09, 0.08)
# bf16: both heads round the same bf16 logits; the reference's head gradient is a bf16 matmul,
# the chunked one accumulates in fp32, hence a percent-level gradient tolerance
TOLERANCE = {torch.bfloat16: {"loss_rel": 1e-2, "logprob_abs": 5e-2, "grad_rel": 5e-2, "packed_mean": 2e-2},
             torch.float32: {"loss_rel": 1e-5, "logprob_abs": 1e-4, "grad_rel": 1e-4, "packed_mean": 1e-4}}
CHUNK_TOKENS = 1024     # the policy's logprob_chunk_tokens default (rl/policy.py), as the plan is given
LEAK_MARGIN = 5.0      # a leak must move log-probs at least this many times the packing difference


class CheckFailed(AssertionError):
    """A check's result is wrong; its figures still go to the report."""

    def __init__(self, message: str, figures: dict):
        super().__init__(message)
        self.figures = figures


class Context:
    """What the checks share: the settings, the saved checkpoint, and models a later check reuses."""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.shape = replace(WIDTHS[args.widths], layers=args.layers)
        self.sizes = SIZES[args.widths]
        self.update_tokens = args.update_tokens or (32768 if args.widths == "14b" else 256)
        self.work = Path(tempfile.mkdtemp(prefix="rstar2_proof_", dir=args.work))
        self.checkpoint = self.work / "random_bf16"
        self.kept: dict = {}
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def random_model(ctx: Context, seed: int):
    """A random fp32 Qwen3 of ctx.shape on ctx.device, its parameter count checked against the shape."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with ctx.device:
        model = AutoModelForCausalLM.from_config(sm.qwen3_config(ctx.shape), dtype=torch.float32)
    count = sum(p.numel() for p in model.parameters())
    if count != ctx.shape.total_params():
        raise AssertionError(f"built {count} parameters, the shape says {ctx.shape.total_params()}")
    return model


def build_random_checkpoint(ctx: Context) -> None:
    """The random model, saved as bf16 safetensors (as released checkpoints are)."""
    model = random_model(ctx, seed=0)
    state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    model.save_pretrained(ctx.checkpoint, state_dict=state)
    del model, state
    ctx.free()


def reference_model(ctx: Context, device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ctx.checkpoint, dtype=torch.float32,
                                                attn_implementation="sdpa").to(device)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def check_sharded_load(ctx: Context) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from rstar2_cli.rl.model_load import DEFAULT_LOAD_METHOD, build_policy_model

    start = time.perf_counter()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    sharded = build_policy_model(str(ctx.checkpoint), sharded=True, device=ctx.device, mp_policy=policy)
    ctx.sync()
    load_s = time.perf_counter() - start
    ctx.kept["fsdp"] = sharded          # the chunked-head check runs on it
    reference = reference_model(ctx, "cpu")
    ours = dict(sharded.state_dict())
    differing = [k for k, v in reference.state_dict().items() if not torch.equal(full(ours[k]).cpu(), v)]
    missing = sorted(set(reference.state_dict()) ^ set(ours))
    del reference, ours
    if differing or missing:
        raise AssertionError(f"{len(differing)} tensors differ from from_pretrained (first {differing[:3]}), "
                             f"names not in both: {missing[:3]}")
    return {"method": DEFAULT_LOAD_METHOD, "load_s": round(load_s, 2), "tensors_equal": True}


def check_chunked_head(ctx: Context) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from rstar2_cli.rl.logprobs import final_hidden_states, head_weight, token_logprobs_with_loss
    from rstar2_cli.rl.loss import clip_higher_loss
    from rstar2_cli.rl.model_load import build_policy_model

    model = ctx.kept.pop("fsdp", None)
    if model is None:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        model = build_policy_model(str(ctx.checkpoint), sharded=True, device=ctx.device, mp_policy=policy)
    gen = torch.Generator().manual_seed(1)
    n = ctx.sizes["head_tokens"]
    ids = torch.randint(0, ctx.shape.vocab, (1, n + 1), generator=gen).to(ctx.device)
    pos = torch.arange(n + 1, device=ctx.device)[None]
    targets = ids[0, 1:]
    adv = (torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1).to(ctx.device)
    mask = torch.ones(n, device=ctx.device)

    def loss_of(logp, sl=slice(None)):
        return clip_higher_loss(logp, logp.detach(), adv[sl], mask[sl], float(n), 0.2, 0.28)

    def grads() -> dict[str, torch.Tensor]:
        out = {k: full(p.grad).float().cpu() for k, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return out

    hidden = final_hidden_states(model, ids, pos)[0, :-1]
    loss, logp, _ = token_logprobs_with_loss(hidden, head_weight(model), targets, CHUNK_TOKENS, loss_of)
    loss.backward()
    chunked = grads()
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
    ctx.free()
    tol = TOLERANCE[torch.bfloat16]
    loss = loss.detach()
    figures = {"tokens": n, "loss": float(loss), "loss_rel_diff": abs(float(loss - ref_loss)) / abs(float(ref_loss)),
               "logprob_max_abs_diff": float((logp - ref_logp).abs().max()),
               "grad_max_rel_diff": worst, "grad_worst_param": worst_name}
    bad = [k for k, key in (("loss_rel_diff", "loss_rel"), ("logprob_max_abs_diff", "logprob_abs"),
                            ("grad_max_rel_diff", "grad_rel")) if figures[k] > tol[key]]
    if bad:
        raise CheckFailed(f"beyond the bf16 tolerance {tol}: {', '.join(bad)}", figures)
    return figures


def policy_for(ctx: Context, model=None, *, micro_batch_tokens: int, checkpointing: bool = False):
    from rstar2_cli.rl.dist import setup_distributed
    from rstar2_cli.rl.policy import PolicyTrainer

    model_cfg, optim_cfg, loss_cfg = gpu_smoke.policy_configs()
    model_cfg = (model_cfg.model_copy(update={"gradient_checkpointing": checkpointing})
                 if hasattr(model_cfg, "model_copy") else SimpleNamespace(**{**vars(model_cfg),
                                                                             "gradient_checkpointing": checkpointing}))
    model = reference_model(ctx, ctx.device) if model is None else model
    return PolicyTrainer(model_cfg, optim_cfg, loss_cfg, micro_batch_tokens=micro_batch_tokens, model=model,
                         info=setup_distributed(), attn_implementation="auto", logprob_chunk_tokens=CHUNK_TOKENS)


def rows_of(policy, batch) -> list:
    """The micro-batches `policy` cuts `batch` into (its budget and layout, rl/packing.py)."""
    from rstar2_cli.rl.packing import micro_batches

    return micro_batches([(t.prompt_ids, t.response_ids) for t in batch], policy.micro_batch_tokens, policy.layout)


def check_packed_attention(ctx: Context) -> dict:
    from rstar2_cli.rollout.trajectory import Trajectory

    budget = ctx.sizes["attn_budget"]
    policy = policy_for(ctx, micro_batch_tokens=budget)
    ctx.kept["policy_model"] = policy.model
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
               "dtype": str(policy.dtype).removeprefix("torch."), "trajectories": len(batch),
               "micro_batches": len(rows), "max_per_micro_batch": max(len(r.spans) for r in rows),
               "packed_vs_alone_mean_abs": float(diff.mean()), "packed_vs_alone_max_abs": float(diff.max()),
               "leak_mean_abs": float(leak.mean())}
    del policy
    tol = TOLERANCE[torch.bfloat16 if ctx.cuda else torch.float32]["packed_mean"]
    if figures["max_per_micro_batch"] < 2:
        raise CheckFailed("no micro-batch holds two trajectories: nothing was packed", figures)
    if figures["packed_vs_alone_mean_abs"] > tol:
        raise CheckFailed(f"packed log-probs differ from each trajectory alone by more than {tol}", figures)
    if figures["leak_mean_abs"] < LEAK_MARGIN * figures["packed_vs_alone_mean_abs"]:
        raise CheckFailed(f"a cross-sequence leak would change log-probs by less than {LEAK_MARGIN}x the "
                          "packing difference: the check cannot tell them apart", figures)
    assert LAYOUT_OF[figures["attn_implementation"]] == figures["layout"]
    return figures
