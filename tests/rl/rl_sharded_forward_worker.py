"""Forward + backward through the sharded model of the model-load path, under torchrun (gloo).

argv: model_dir out_dir. Every rank builds the model as the trainer does on the meta device
(`build_policy_model(..., sharded=True)`, no `mp_policy` given), runs the same packed row forward
and backward with gradient checkpointing; rank 0 writes out_dir/result.pt with the loss and the
gathered full gradients.
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rstar2_cli.rl.update.model_load import build_policy_model


def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 384, (1, 24), generator=gen)
    positions = torch.cat([torch.arange(10), torch.arange(14)])[None]   # two packed sequences
    return {"input_ids": ids, "position_ids": positions, "labels": ids.clone()}


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    model = build_policy_model(model_dir, sharded=True, device=torch.device("cpu"), gradient_checkpointing=True)
    model.train()
    loss = model(**batch(), use_cache=False).loss
    loss.backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    if dist.get_rank() == 0:
        torch.save({"loss": loss.detach(), "grads": grads}, Path(out_dir) / "result.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
