"""Under torchrun (2 ranks, gloo): the nccl path's gathers on a real FSDP2-sharded policy.

Rank 0 is a host sending to 3 replicas (`send_to_replicas` with recording groups), rank 1 joins the
gathers as `NCCLTransport.send` does off a host. Every all-gather is recorded (op and dtype).
argv: out_dir; each rank writes out_dir/rank<r>.json."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"))
from recorders import RecordingClient, RecordingGroup  # noqa: E402
from rl_synthetic import build_tiny_model  # noqa: E402

from rstar2_cli.rl.update.model_load import place_model  # noqa: E402
from rstar2_cli.rollout.weight_sync.nccl import send_to_replicas  # noqa: E402
from rstar2_cli.rollout.weight_sync.source import policy_weight_source  # noqa: E402


class Gathers(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather" in str(func):
            self.seen.append(str(args[0].dtype))
        return func(*args, **(kwargs or {}))


def main(out_dir: str) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build_tiny_model(seed=0)
    expected = {n: p.detach().bfloat16() for n, p in model.named_parameters()}
    place_model(model, sharded=True, device=torch.device("cpu"),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    source = policy_weight_source(model, torch.bfloat16)
    groups = [RecordingGroup() for _ in range(3)]
    with Gathers() as gathers:
        if rank == 0:
            send_to_replicas(source, groups, RecordingClient(), 1 << 16)
        else:
            for _ in source:
                pass
    equal = all(torch.equal(t, expected[n]) for n, t in source)
    result = {
        "gathers": gathers.seen,
        "params": len(expected),
        "equal": equal,
        "group_bytes": [sum(g.sizes) for g in groups],
        "full_bf16_bytes": sum(t.numel() * 2 for t in expected.values()),
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
