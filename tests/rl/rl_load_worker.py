"""Sharded loading under torchrun: each load method, then a checkpoint save -> resume round trip.

argv: out_dir model_dir [model_dir ...]. For each model dir and method, rank 0 writes
out_dir/<i>_<method>.pt (the gathered full state and the rotary inv_freq); then the "slices"
policy of the first dir is saved with save_checkpoint, loaded into a fresh policy and rank 0
writes out_dir/saved.pt and out_dir/resumed.pt (both gathered full states) and out_dir/optim.pt
(both AdamW states, gathered); a save with `fail_write` (a full disk) writes each rank's
error to out_dir/fault_<rank>.txt; a checkpoint in out_dir/single (saved by one process) is
loaded at this world size into out_dir/from_single.pt.
"""
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

sys.path.insert(0, str(Path(__file__).parent))
from rl_synthetic import make_trajectories  # noqa: E402

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig  # noqa: E402
from rstar2_cli.rl.update.checkpoint import (  # noqa: E402
    CheckpointWriteError,
    load_checkpoint,
    save_checkpoint,
)
from rstar2_cli.rl.ranks.dist import setup_distributed  # noqa: E402
from rstar2_cli.rl.update.model_load import build_policy_model  # noqa: E402
from rstar2_cli.rl.update.policy import PolicyTrainer  # noqa: E402


def _full_optimizer(policy: PolicyTrainer) -> dict:
    """AdamW state gathered whole on rank 0, for comparison (other ranks: {})."""
    return get_optimizer_state_dict(policy.model, policy.optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _policy(model_dir: str) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path=model_dir), OptimConfig(lr=1e-3), LossConfig(), micro_batch_tokens=64,
                         info=setup_distributed())


def main(out_dir: str, model_dirs: list[str]) -> None:
    out = Path(out_dir)
    first = _policy(model_dirs[0])
    rank = first.info.rank
    for i, model_dir in enumerate(model_dirs):
        for method in ("slices", "broadcast"):
            model = build_policy_model(model_dir, sharded=True, device=first.device, method=method)
            first.model = model
            state = dict(first.full_state_dict())
            if rank == 0:
                rotary = model.model.rotary_emb.inv_freq.clone()
                tied = model.lm_head.weight is model.model.embed_tokens.weight
                torch.save({"state": state, "inv_freq": rotary, "tied": tied}, out / f"{i}_{method}.pt")
    policy = _policy(model_dirs[0])
    batch = make_trajectories(8, seed=1)[rank::policy.info.world_size]     # any split: AdamW state to save
    policy.update(batch, [1.0 - 2.0 * (j % 2) for j in range(len(batch))])   # moved weights, AdamW state
    saved = dict(policy.full_state_dict())
    save_checkpoint(out / "ckpt" / "step_000001", policy, step=1)
    resumed = _policy(model_dirs[0])
    with torch.no_grad():                 # so the load must overwrite every local shard
        for p in resumed.model.parameters():
            p.to_local().zero_()
    load_checkpoint(out / "ckpt", resumed)
    got = dict(resumed.full_state_dict())
    saved_optim, got_optim = _full_optimizer(policy), _full_optimizer(resumed)
    if rank == 0:
        torch.save(saved, out / "saved.pt")
        torch.save(got, out / "resumed.pt")
        torch.save({"saved": saved_optim, "resumed": got_optim}, out / "optim.pt")
    # a full disk on the last rank only: every rank raises, the previous checkpoint stays latest
    try:
        save_checkpoint(out / "ckpt" / "step_000002", policy, step=2, fail_write=True)
        (out / f"fault_{rank}.txt").write_text("no error")
    except CheckpointWriteError as e:
        (out / f"fault_{rank}.txt").write_text(str(e))
    if (out / "single").is_dir():          # saved by one process: resumed here at two ranks
        other = _policy(model_dirs[0])
        load_checkpoint(out / "single", other)
        state, optim = dict(other.full_state_dict()), _full_optimizer(other)
        if rank == 0:
            torch.save({"state": state, "optim": optim}, out / "from_single.pt")
    torch.distributed.barrier()           # rank 1 must not tear gloo down while rank 0 still writes
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
