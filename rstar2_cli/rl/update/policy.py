"""The policy update: owns the HF model, AdamW and the LR schedule; one call per RL step.

Why one class: the trainer loop should read "rollout -> reward -> RoC -> advantages ->
policy.update -> weight sync"; sharding, packing, old logprobs, token normalisation and
gradient clipping are details that belong together here.

Parallelism: under torchrun (WORLD_SIZE > 1, the process group joined by the caller through
`rl_dist.setup_distributed`) each decoder layer and then the root are wrapped
with FSDP2 `fully_shard` (gloo on CPU, nccl on GPU); the model is built on the meta device and
each rank reads only its own shards from the checkpoint (rl/update/model_load.py). Every rank receives its own shard of
trajectories with the global mini-batch of each (rl/ranks/exchange.py); the global loss-token count of each mini-batch
is all-reduced, so N ranks take the 1-rank optimizer steps.
FSDP2 averages gradients over ranks, so the loss is multiplied by world_size before backward to
turn that mean into the sum the global token normalisation expects. All ranks must run the same
number of forward/backward passes (FSDP collectives), so a rank with fewer micro-batches runs
zero-weighted dummy passes. Without torchrun there is no process group and no FSDP wrapper.

Precision: parameters and AdamW state stay fp32 (master weights); ModelConfig.dtype picks the
compute dtype ("auto": bf16 on GPU, fp32 on CPU) via FSDP2 MixedPrecisionPolicy (reduce in fp32)
or, unsharded, torch.autocast.

PPO epochs: one pass over the batch split into `ppo_mini_batches` optimizer steps. The old
logprobs are the current policy's before the first step. With the release recipe's single
mini-batch (ppo_mini_batch_size = train_batch_size = 128) and synchronous rollouts they are the
update forward's own, detached (`reuses_update_logprobs`: no separate pass), the ratio is exactly 1
and clipping never fires; only TIS (vLLM vs trainer mismatch) reweights tokens. With
ppo_mini_batches > 1 or train.max_staleness >= 1 a no-grad pass computes them first; the later
mini-batches see a moved policy and Clip-Higher acts. The LR schedule advances once per
update() call that took an optimizer step (one RL step), like verl; the trainer skips update()
altogether on a step with nothing left after filtering. A mini-batch whose loss or gradient norm
is NaN or inf takes no optimizer step (`nonfinite_skipped` counts them; the trainer's
`train.max_nonfinite_steps` ends a run of them). With `loss.old_logprobs: rollout` the old
log-probs are the engine's sampling log-probs instead (no pass at all), so at max_staleness >= 1
the clip bounds each step against the policy that sampled the batch.

Engine gap: `train/logprob_abs_diff_vllm` is the mean |trainer - engine| log-prob over the loss
tokens of every trajectory that has the engine's log-probs; the update's result also holds it per
trajectory (`UpdateResult.gaps`) for the rollout log (rl/update/logprob_gap.py), from the same tensors.

Attention: each trajectory attends only to itself, never across a micro-batch
(`train.attn_implementation`, models/attention.py): flash-attn's variable-length kernel over packed
rows on GPU, else SDPA's causal kernel over length-bucketed padded rows (rl/update/packing.py). The
update and the proximal pass use the same layout.

Log-probs: only the loss positions of each packed row are scored (tool-response tokens never
reach the LM head), `logprob_chunk_tokens` at a time, from the decoder's last hidden states
(rl/update/logprobs.py): the head's peak memory is chunk x vocab, not micro-batch x vocab.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.models.attention import LAYOUT_OF, resolve_attention
from rstar2_cli.rl.update.logprob_gap import Gap, Label, engine_gaps
from rstar2_cli.rl.update.logprobs import final_hidden_states, head_weight, token_logprobs, token_logprobs_with_loss
from rstar2_cli.rl.update.model_load import build_policy_model, place_model
from rstar2_cli.rl.update.loss import LossStats, clip_higher_loss, loss_stats, tis_weights
from rstar2_cli.rl.update.packing import LAYOUTS, PackedRow, micro_batches
from rstar2_cli.rollout.trajectory import Trajectory

if TYPE_CHECKING:  # only for annotations: benchmarks/gpu/gpu_smoke.py runs this without pydantic
    from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig, RecipeConfig


class UpdateResult(dict):
    """One update's columns (loss, grad_norm, lr, ...: a dict), and `gaps`: the engine/trainer
    log-prob gap of each trained trajectory that has the engine's log-probs, keyed by
    `logprob_gap.gap_label` (rl/update/logprob_gap.py); {} when nothing was trained."""

    def __init__(self, columns: dict[str, float] | None = None, gaps: dict[Label, Gap] | None = None):
        super().__init__(columns or {})
        self.gaps: dict[Label, Gap] = gaps if gaps is not None else {}


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def warmup_then_constant(warmup_steps: int):
    """LR factor for scheduler step s (0-based): (s+1)/warmup during warm-up, then 1.

    verl uses s/warmup, which makes the first update a no-op (lr 0); we start at lr/warmup.
    """
    return lambda s: 1.0 if warmup_steps <= 0 else min(1.0, (s + 1) / warmup_steps)


def loss_positions(t: Trajectory) -> torch.Tensor:
    """Bool, one per response token: the tokens the loss uses (loss_mask != 0; tool responses are 0)."""
    if len(t.loss_mask) != len(t.response_ids):
        raise ValueError(f"trajectory {t.prompt_id}#{t.sample_index}: loss_mask has {len(t.loss_mask)} "
                         f"entries for {len(t.response_ids)} response tokens")
    return torch.tensor(t.loss_mask, dtype=torch.float32) != 0


@dataclass
class TokenTensors:
    """Per-token tensors of one trajectory, or of a packed row (its members' concatenated)."""
    select: torch.Tensor           # bool per response token: a loss position (`loss_positions`)
    mask: torch.Tensor             # from here on one entry per loss position: the loss-mask value
    adv: torch.Tensor
    old: torch.Tensor | None       # old log-probs; None: the update's own, detached
    rollout: torch.Tensor | None   # the engine's log-probs; None where a member has none (then the
                                   # whole row trains without TIS: counted, `tis_off_tokens`)

    @classmethod
    def concat(cls, parts: Sequence["TokenTensors"], device: torch.device) -> "TokenTensors":
        def cat(name: str) -> torch.Tensor | None:
            xs = [getattr(p, name) for p in parts]
            return None if any(x is None for x in xs) else torch.cat(xs).to(device)
        return cls(torch.cat([p.select for p in parts]), *(cat(n) for n in ("mask", "adv", "old", "rollout")))


class PolicyTrainer:
    def __init__(self, model_cfg: ModelConfig, optim_cfg: OptimConfig, loss_cfg: LossConfig, *,
                 micro_batch_tokens: int, ppo_mini_batches: int = 1, dual_clip: float | None = None,
                 model=None, info: rl_dist.DistInfo | None = None, logprob_chunk_tokens: int = 1024,
                 max_staleness: int = 0, attn_implementation: str = "auto", layout: str | None = None,
                 temperature: float = 1.0, sharded: bool | None = None):
        """`info`: this process's ranks and device, from `rl_dist.setup_distributed()` (the
        caller's entry point starts torch.distributed); default: the process as it stands.
        `attn_implementation`: see models/attention.py. `layout`: the micro-batch layout, by default the
        one that goes with the kernel; `benchmarks/timing/bench_update.py` sets "packed" under SDPA to
        measure the dense-mask baseline. `temperature`: the rollout's sampling temperature; every
        log-prob here is of logits / temperature, the distribution the engine sampled from (verl's
        dp_actor divides the logits the same way), so ratios and TIS compare like with like; > 0, as
        the recipe validates it at load (config.RolloutConfig and its RL check).
        `sharded`: FSDP2 or not; default: when world_size > 1. True at world size 1 (a 1-rank process
        group must exist) runs one rank of the FSDP2 path on one GPU (benchmarks/gpu/gpu_trainer_proof.py)."""
        if ppo_mini_batches < 1:
            raise ValueError(f"ppo_mini_batches must be >= 1, got {ppo_mini_batches}")
        self.model_cfg, self.optim_cfg, self.loss_cfg = model_cfg, optim_cfg, loss_cfg
        self.micro_batch_tokens = micro_batch_tokens
        self.ppo_mini_batches = ppo_mini_batches
        self.dual_clip = dual_clip
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.max_staleness = max_staleness
        self.temperature = float(temperature)
        self.info = info if info is not None else rl_dist.process_info()
        self.device = self.info.device
        self.dtype = compute_dtype(model_cfg.dtype, self.device)
        self.sharded = self.info.world_size > 1 if sharded is None else bool(sharded)
        if self.sharded and not torch.distributed.is_initialized():
            raise ValueError("sharded=True needs a process group: start one (rl/ranks/dist.py setup_distributed, or a "
                             "1-rank group) before building the policy")
        self.attention = resolve_attention(attn_implementation, self.device, self.dtype)
        if layout is not None and layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
        self.layout = layout or LAYOUT_OF[self.attention.implementation]
        mp = None
        if self.sharded:
            mp = MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)
        placing = dict(sharded=self.sharded, device=self.device, mp_policy=mp,
                       gradient_checkpointing=model_cfg.gradient_checkpointing,
                       attn_implementation=self.attention.implementation)
        # Sharded: built on the meta device, only this rank's shards read (rl/update/model_load.py).
        self.model = (build_policy_model(model_cfg.path, **placing) if model is None
                      else place_model(model, **placing))
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optim_cfg.lr, betas=tuple(optim_cfg.betas),
                                           weight_decay=optim_cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_then_constant(optim_cfg.warmup_steps))

    # ------------------------------------------------------------ forward passes

    def _autocast(self):
        if self.sharded or self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def _row_inputs(self, row: PackedRow, select: torch.Tensor):
        """(final hidden states [N, H], LM-head weight, targets [N]) of the row's response tokens
        where `select` is true (span after span); call under `_autocast`."""
        varlen = row.varlen_kwargs(self.device) if self.attention.takes_varlen_kwargs else {}
        hidden = final_hidden_states(self.model, row.input_ids.to(self.device), row.position_ids.to(self.device),
                                     **varlen)
        if self.temperature != 1.0:       # (h / T) W^T = logits / T; backward flows through the division
            hidden = hidden / self.temperature
        positions = row.logit_positions()[select.cpu()].to(self.device)
        return (
            hidden.reshape(-1, hidden.shape[-1])[positions],
            head_weight(self.model),
            row.target_ids()[select.cpu()].to(self.device),
        )

    def _dummy_pass(self, backward: bool) -> None:
        """A zero-weighted pass so this rank joins the FSDP collectives of the other ranks."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        with self._autocast():
            out = self.model(input_ids=ids, use_cache=False)
        if backward:
            (out.logits.float().sum() * 0.0).backward()

    def _rows(self, batch: Sequence[Trajectory]) -> list[PackedRow]:
        return micro_batches([(t.prompt_ids, t.response_ids) for t in batch], self.micro_batch_tokens, self.layout)

    def _aligned_count(self, n: int) -> int:
        return int(rl_dist.all_reduce_max([float(n)], self.device)[0])

    @torch.no_grad()
    def compute_logprobs(self, batch: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Current-policy logprobs of each trajectory's loss tokens (`loss_positions`), CPU fp32 tensors."""
        rows = self._rows(batch)
        keep = [loss_positions(t) for t in batch]
        result: list[torch.Tensor | None] = [None] * len(batch)
        for i in range(self._aligned_count(len(rows))):
            if i >= len(rows):
                self._dummy_pass(backward=False)
                continue
            spans = rows[i].spans
            with self._autocast():
                inputs = self._row_inputs(rows[i], torch.cat([keep[s.index] for s in spans]))
                logp, _ = token_logprobs(*inputs, self.logprob_chunk_tokens)
            for span, piece in zip(spans, logp.split([int(keep[s.index].sum()) for s in spans])):
                result[span.index] = piece.cpu()
        return result  # type: ignore[return-value]

    @property
    def reuses_update_logprobs(self) -> bool:
        """Whether the update's own forward gives the old log-probs, so no separate no-grad pass runs.

        With one mini-batch and synchronous rollouts (max_staleness 0) the old log-probs are those of
        the very weights the update's forward runs with (no optimizer step comes between), so the
        ratio is exactly 1 either way; the detached log-probs of that forward serve for the ratio,
        TIS and the vLLM-difference metric. Otherwise a pass before the first step computes them."""
        return self.ppo_mini_batches == 1 and self.max_staleness == 0

    # ------------------------------------------------------------ the update

    def _token_tensors(self, t: Trajectory, adv: float, old: torch.Tensor | None) -> TokenTensors:
        select = loss_positions(t)
        rollout = (torch.tensor(t.logprobs, dtype=torch.float32)[select]
                   if len(t.logprobs) == len(t.response_ids) else None)
        return TokenTensors(select, torch.tensor(t.loss_mask, dtype=torch.float32)[select],
                            torch.full((int(select.sum()),), float(adv)), old, rollout)

    @staticmethod
    def _rollout_logprobs(t: Trajectory) -> torch.Tensor:
        """The engine's sampling log-probs at `t`'s loss positions (`loss.old_logprobs: rollout`)."""
        if len(t.logprobs) != len(t.response_ids):
            raise ValueError(f"loss.old_logprobs: rollout needs the engine's log-prob of every response token; "
                             f"trajectory {t.prompt_id}#{t.sample_index} has {len(t.logprobs)} for "
                             f"{len(t.response_ids)} tokens")
        return torch.tensor(t.logprobs, dtype=torch.float32)[loss_positions(t)]

    def _tis(self, old: torch.Tensor, rollout: torch.Tensor | None) -> torch.Tensor | None:
        return tis_weights(old, rollout, self.loss_cfg.tis_cap) if self.loss_cfg.tis and rollout is not None else None

    def _row_loss(self, row: PackedRow, tok: TokenTensors, global_tokens: float):
        """(loss, logprobs, entropy) at the row's loss positions; the loss carries the gradient."""
        cfg = self.loss_cfg

        def token_loss(logp: torch.Tensor, sl: slice) -> torch.Tensor:
            old = logp.detach() if tok.old is None else tok.old[sl]
            tis = self._tis(old, None if tok.rollout is None else tok.rollout[sl])
            return clip_higher_loss(logp, old, tok.adv[sl], tok.mask[sl], global_tokens, cfg.eps_low, cfg.eps_high,
                                    tis=tis, dual_clip=self.dual_clip)

        with self._autocast():
            return token_logprobs_with_loss(*self._row_inputs(row, tok.select), self.logprob_chunk_tokens,
                                            token_loss, with_entropy=True)

    def update(self, batch: Sequence[Trajectory], advantages: Sequence[float],
               mini_batches: Sequence[int] | None = None) -> UpdateResult:
        """One RL step on this rank's shard: ppo_mini_batches optimizer steps, then LR step.
        `mini_batches`: the global mini-batch of each trajectory (`rl/ranks/exchange.py`'s plan, which
        makes N ranks take the 1-rank optimizer steps); default: the local list split in order."""
        if len(batch) != len(advantages):
            raise ValueError(f"{len(batch)} trajectories but {len(advantages)} advantages")
        if self.loss_cfg.old_logprobs == "rollout":
            old = [self._rollout_logprobs(t) for t in batch]
        else:
            old = None if self.reuses_update_logprobs else self.compute_logprobs(batch)
        if mini_batches is None:
            chunks = [list(c) for c in np.array_split(np.arange(len(batch)), self.ppo_mini_batches)]
        else:
            chunks = [[i for i, b in enumerate(mini_batches) if b == m] for m in range(self.ppo_mini_batches)]
        losses, norms, stats, vllm_diff, taken = [], [], LossStats(), [0.0, 0.0], 0
        gaps: dict[Label, Gap] = {}
        tis_off = 0.0     # loss tokens trained without TIS although loss.tis is on (`TokenTensors.concat`)
        for chunk in chunks:
            tensors = {i: self._token_tensors(batch[i], advantages[i], None if old is None else old[i]) for i in chunk}
            local_tokens = sum(float(tensors[i].mask.sum()) for i in chunk)
            global_tokens = rl_dist.all_reduce_sum([local_tokens], self.device)[0]
            if global_tokens <= 0:
                continue
            rows = self._rows([batch[i] for i in chunk])
            loss_sum = 0.0
            for r in range(self._aligned_count(len(rows))):
                if r >= len(rows):
                    self._dummy_pass(backward=True)
                    continue
                tok = TokenTensors.concat([tensors[chunk[s.index]] for s in rows[r].spans], self.device)
                if self.loss_cfg.tis and tok.rollout is None:
                    tis_off += float(tok.mask.numel())
                loss, logp, entropy = self._row_loss(rows[r], tok, global_tokens)
                (loss * self.info.world_size).backward()
                loss_sum += float(loss.detach())
                old_lp = logp if tok.old is None else tok.old
                stats += loss_stats(logp, old_lp, tok.adv, tok.mask, self.loss_cfg.eps_low, self.loss_cfg.eps_high,
                                    tis=self._tis(old_lp, tok.rollout), entropy=entropy, tis_cap=self.loss_cfg.tis_cap)
                # trainer vs engine at the update's start (rollout mode: its forward), per member
                ref = logp.detach() if self.loss_cfg.old_logprobs == "rollout" else old_lp
                engine_gaps([(batch[chunk[s.index]], tensors[chunk[s.index]]) for s in rows[r].spans], ref,
                            vllm_diff, gaps)
            norm = self._clip_grad_norm()
            loss_total = rl_dist.all_reduce_sum([loss_sum], self.device)[0]
            norms.append(norm)
            losses.append(loss_total)
            # A NaN/inf loss or gradient norm: no optimizer step, so weights and AdamW moments stay
            # as they were. Both are global (the norm over every rank's shards, the loss summed), so
            # every rank decides alike.
            if math.isfinite(norm) and math.isfinite(loss_total):
                self.optimizer.step()
                taken += 1
            self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        if taken:                        # no optimizer step (no loss token, or non-finite): no LR step either
            self.scheduler.step()
        out = self._update_columns(losses, norms, stats, vllm_diff + [tis_off], lr, len(batch))
        out["optimizer_steps"], out["nonfinite_skipped"] = float(taken), float(len(losses) - taken)
        return UpdateResult(out, gaps)

    def _clip_grad_norm(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_cfg.grad_clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def _update_columns(self, losses, norms, stats: LossStats, vllm_diff, lr, n_local) -> dict[str, float]:
        names = list(stats.__dataclass_fields__)
        summed = rl_dist.all_reduce_sum([getattr(stats, k) for k in names] + vllm_diff + [float(n_local)], self.device)
        total = LossStats(**dict(zip(names, summed[:len(names)])))
        out = {"loss": float(np.mean(losses)) if losses else 0.0,
               "grad_norm": float(np.mean(norms)) if norms else 0.0,
               "grad_norm_max": float(np.max(norms)) if norms else 0.0,
               "lr": lr, "optimizer_steps": float(len(losses)), "trajectories": summed[-1]}
        out.update(total.as_metrics())
        if summed[len(names) + 1] > 0:
            out["logprob_abs_diff_vllm"] = summed[len(names)] / summed[len(names) + 1]
        if self.loss_cfg.tis:
            out["tis_off_tokens"] = summed[len(names) + 2]
        return out

    # ------------------------------------------------------------ weights out

    def full_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) pairs for checkpoints (engines get `full_state_for_engines`).

        Sharded: a collective (call on every rank) gathering CPU copies on rank 0; other ranks
        get an empty iterator. Unsharded: the live parameters (detached, on the training device,
        no copy), so consume them before the next update()."""
        if not self.sharded:
            return iter([(k, v.detach()) for k, v in self.model.state_dict().items()])
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return iter(list(sd.items()))

    def full_state_for_engines(self, keep: bool) -> list[tuple[str, torch.Tensor]]:
        """(name, full tensor) pairs for the rollout hosts' engines; every rank calls it.

        Unsharded: the live parameters, as `full_state_dict` (no copy). Sharded: each parameter is
        all-gathered on the training device in turn (`DTensor.full_tensor`, a collective in the
        same order on every rank) and copied to CPU where `keep` (a rollout host), else dropped at
        once: beyond its shard a rank holds one gathered parameter at a time on its device, and
        only hosts keep the full weights, on CPU, for as long as they push them (as rank 0 did
        with `full_state_dict`). Non-host ranks get an empty list."""
        if not self.sharded:
            return list(self.full_state_dict())
        kept: list[tuple[str, torch.Tensor]] = []
        for name, value in self.model.state_dict().items():
            full = value.full_tensor() if isinstance(value, DTensor) else value
            if keep:
                kept.append((name, full.detach().to("cpu")))
        return kept


def policy_for(cfg: RecipeConfig, info: rl_dist.DistInfo) -> PolicyTrainer:
    """The RL run's policy as its recipe sets it: the model, AdamW and its
    schedule, the loss, the micro-batch and mini-batch plan, the attention kernel, and log-probs at
    the rollout's sampling temperature."""
    t = cfg.train
    return PolicyTrainer(cfg.model, cfg.optim, cfg.loss, micro_batch_tokens=t.micro_batch_tokens,
                         ppo_mini_batches=t.ppo_mini_batches, dual_clip=cfg.loss.dual_clip, info=info,
                         logprob_chunk_tokens=t.logprob_chunk_tokens, max_staleness=t.max_staleness,
                         attn_implementation=t.attn_implementation, temperature=cfg.rollout.temperature)
