"""What every check of benchmarks/gpu/gpu_trainer_proof.py shares: the sizes, the outcome types,
the random model and its bf16 checkpoint, the 1-rank process group and the policy built on it.

Only torch, transformers and the light modules of this source tree are imported (the lent GPU
image has no vLLM and no pydantic: benchmarks/gpu/gpu_image.py). The policy is built as `rstar2 rl`
builds it on GPU, FSDP2 (`fully_shard` per decoder layer, then the root) over a process group,
here of one rank, with plain namespaces holding the recipe defaults (gpu_smoke.BARE_NODE_CONFIGS,
checked against rstar2_cli/config.py by tests/benchmarks/test_smoke_model.py).
"""
from __future__ import annotations

import gc
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

import smoke_model as sm
from gpu_smoke import BARE_NODE_CONFIGS
from rstar2_cli.hosts.ports import master_store
from rstar2_cli.launch.model_shape import QWEN3_14B
from rstar2_cli.rl.ranks.dist import process_info
from rstar2_cli.rl.update.packing import micro_batches
from rstar2_cli.rl.update.policy import PolicyTrainer

WIDTHS = {"14b": QWEN3_14B, "small": replace(sm.TINY, tie_embeddings=False)}
# per widths: tokens of the chunked-head check, micro-batch budget of the attention check, tokens
# of the sharded-load forward, layers and update tokens where no card is there to size them
SIZES = {"14b": {"head_tokens": 4096, "attn_budget": 4096, "forward_tokens": 128, "layers": 2, "update_tokens": 8192},
         "small": {"head_tokens": 48, "attn_budget": 96, "forward_tokens": 32, "layers": 2, "update_tokens": 256}}
CHUNK_TOKENS = 1024     # the policy's logprob_chunk_tokens default (rl/update/policy.py), as the plan is given
GIB = 2**30


class CheckFailed(AssertionError):
    """A check's result is wrong; its figures still go to the report."""

    def __init__(self, message: str, figures: dict):
        super().__init__(message)
        self.figures = figures


class Skipped(Exception):
    """The check cannot run here; the message says why (printed as a skip). `figures`: what it
    built before it stopped (a GPU-only check's arguments, made on CPU too)."""

    def __init__(self, message: str, figures: dict | None = None):
        super().__init__(message)
        self.figures = figures or {}


def card_gib(device: torch.device) -> float | None:
    """The GPU's memory in GiB as torch reports it (an H100 80GB: about 79.1), None on CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / GIB


class Context:
    """What the checks share: the settings, the saved checkpoint, and what a later check reuses.
    `layers` and `update_tokens` come from the sizing (trainer_proof_memory.choose_size)."""

    def __init__(self, args, layers: int, update_tokens: int):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.card_gib = card_gib(self.device)
        self.shape = replace(WIDTHS[args.widths], layers=layers)
        self.sizes = SIZES[args.widths]
        self.update_tokens = update_tokens
        self.work = Path(tempfile.mkdtemp(prefix="rstar2_proof_", dir=args.work))
        self.checkpoint = self.work / "random_bf16"
        self.kept: dict = {}
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def process_group_args(device: torch.device) -> dict:
    """`init_process_group` arguments of the proof's 1-rank group (nccl on CUDA, gloo on CPU); FSDP2
    takes its 1-device mesh from it. The store binds its own port (rstar2_cli/hosts/ports.py)."""
    return {"backend": "nccl" if device.type == "cuda" else "gloo", "store": master_store(), "rank": 0,
            "world_size": 1}


def one_rank_group(device: torch.device) -> bool:
    """A 1-rank process group for FSDP2 and DCP, unless one exists; whether this call made it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group(**process_group_args(device))
    return True


def random_model(ctx: Context, seed: int, device: torch.device | None = None):
    """A random fp32 Qwen3 of ctx.shape on `device` (ctx.device), its parameter count checked."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with (device or ctx.device):
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
    """`from_pretrained` of the checkpoint: fp32, SDPA, on `device`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ctx.checkpoint, dtype=torch.float32,
                                                attn_implementation="sdpa").to(device)


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def policy_kwargs(ctx: Context, model=None, *, path: Path | None = None, micro_batch_tokens: int,
                  checkpointing: bool = False) -> dict:
    """PolicyTrainer's arguments as `rstar2 rl` gives them on GPU, FSDP2 on the 1-rank group: the
    recipe defaults; `model` None builds from the HF folder `path` (default: the bf16 checkpoint) on
    the meta device, reading this rank's safetensors slices (rl/update/model_load.py), else places `model`."""
    configs = {k: SimpleNamespace(**BARE_NODE_CONFIGS[k]) for k in ("model", "optim", "loss")}
    configs["model"].gradient_checkpointing = checkpointing
    if model is None:
        configs["model"].path = str(path or ctx.checkpoint)
    return {"model_cfg": configs["model"], "optim_cfg": configs["optim"], "loss_cfg": configs["loss"],
            "micro_batch_tokens": micro_batch_tokens, "model": model, "info": process_info(),
            "attn_implementation": "auto", "logprob_chunk_tokens": CHUNK_TOKENS, "sharded": True}


def policy_for(ctx: Context, model=None, *, path: Path | None = None, micro_batch_tokens: int,
               checkpointing: bool = False):
    return PolicyTrainer(**policy_kwargs(ctx, model, path=path, micro_batch_tokens=micro_batch_tokens,
                                         checkpointing=checkpointing))


def rows_of(policy, batch) -> list:
    """The micro-batches `policy` cuts `batch` into (its budget and layout, rl/update/packing.py)."""
    return micro_batches([(t.prompt_ids, t.response_ids) for t in batch], policy.micro_batch_tokens, policy.layout)


def first_line(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
