"""Run two policy updates on the synthetic batch; launched alone (1 rank) or under torchrun.

argv: model_dir out_dir. Writes out_dir/result.json (losses, grad norms) and, on rank 0,
out_dir/params.pt (full state dict after the updates).
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from rl_synthetic import make_trajectories  # noqa: E402

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig  # noqa: E402
from rstar2_cli.rl.ranks.dist import setup_distributed  # noqa: E402
from rstar2_cli.rl.update.loss import group_advantages  # noqa: E402
from rstar2_cli.rl.update.policy import PolicyTrainer  # noqa: E402
from rstar2_cli.rl.ranks.exchange import plan_shards  # noqa: E402


def main(model_dir: str, out_dir: str) -> None:
    torch.manual_seed(0)
    policy = PolicyTrainer(ModelConfig(path=model_dir, gradient_checkpointing=True),
                           OptimConfig(lr=1e-3, warmup_steps=2), LossConfig(),
                           micro_batch_tokens=64, ppo_mini_batches=2, info=setup_distributed())
    batch = make_trajectories(16, seed=1)
    adv = []
    for g in range(4):
        adv += group_advantages([t.reward + 0.1 * j for j, t in enumerate(batch[4 * g: 4 * g + 4])])
    rank, world = policy.info.rank, policy.info.world_size
    plan = plan_shards([len(t.prompt_ids) + t.response_length for t in batch], world, 2)[rank]
    mine, my_adv, mini = [batch[i] for i, _ in plan], [adv[i] for i, _ in plan], [m for _, m in plan]
    results = [policy.update(mine, my_adv, mini) for _ in range(2)]
    state = dict(policy.full_state_dict())
    if rank == 0:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "result.json").write_text(json.dumps(results))
        torch.save(state, Path(out_dir) / "params.pt")
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
