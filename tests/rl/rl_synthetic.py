"""Synthetic RL test data: a tiny random Qwen3 and random trajectories (imported by the tests,
the conftest and the torchrun worker; a plain module, so its name cannot clash with other conftests)."""
from __future__ import annotations

import random

from rstar2_cli.rollout.trajectory import Trajectory

TINY_QWEN3 = dict(vocab_size=384, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=128, max_position_embeddings=512)


def build_tiny_model(seed: int = 0, tie_word_embeddings: bool = False):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**TINY_QWEN3, tie_word_embeddings=tie_word_embeddings)).float()


def make_trajectories(n: int, seed: int = 0, min_len: int = 5, max_len: int = 40) -> list[Trajectory]:
    """Random token trajectories with a tool-response gap (mask 0) in the middle of some."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = [rng.randrange(384) for _ in range(rng.randint(3, 12))]
        r_len = rng.randint(min_len, max_len)
        r = [rng.randrange(384) for _ in range(r_len)]
        mask = [1] * r_len
        if i % 2 and r_len > 6:
            for j in range(2, 5):
                mask[j] = 0
        logprobs = [(-rng.random() * 5 if m else 0.0) for m in mask]
        out.append(Trajectory(prompt_id=f"p{i // 4}", sample_index=i % 4, prompt_ids=p, response_ids=r,
                              loss_mask=mask, logprobs=logprobs, reward=float(i % 3 == 0)))
    return out




def write_times_seven(path, n: int):
    """`n` problems "What is i*7?" as a JSONL training set at `path`; returns the path."""
    import json

    path.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(n)))
    return path


def tiny_rl_recipe(tiny_model, data, out, *, steps: int, prompts_per_step: int = 2, sandbox_workers: int = 2,
                   name: str = "tiny-e2e") -> dict:
    """The smallest RL recipe that exercises every stage (tools, RoC, update, checkpoints) on CPU."""
    return {
        "name": name,
        "model": {"path": str(tiny_model), "gradient_checkpointing": False},
        "data": {"train": str(data)},
        "rollout": {"max_turns": 2, "max_response_tokens": 24, "tool_timeout": 5},
        "engine": {"cpu_kvcache_space_gb": 1, "max_model_len": 1024},
        "sandbox": {"workers": sandbox_workers},
        "roc": {"enabled": True, "mode": "paper", "oversample": 2, "reject_equal_reward": False},
        "optim": {"lr": 1e-3, "warmup_steps": 0},
        "train": {"steps": steps, "prompts_per_step": prompts_per_step, "group_size": 2, "micro_batch_tokens": 4096,
                  "save_every": 1, "out_dir": str(out), "seed": 3},
    }


def saved_weights(step_dir) -> dict:
    """Every tensor of a checkpoint folder's HF weight files (one or several, per its index)."""
    from safetensors.torch import load_file

    from rstar2_cli.rl.update.model_load import checkpoint_files

    return {k: v for f in checkpoint_files(step_dir) for k, v in load_file(f).items()}


def saved_optimizer_state(step_dir, scratch) -> dict:
    """A checkpoint's AdamW state, whole (`{"state": {name: {...}}, "param_groups": [...]}`), read
    from its DCP folder by torch's own converter into `scratch` (a file path)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from rstar2_cli.rl.update.checkpoint import STATE_DIR

    dcp_to_torch_save(str(step_dir / STATE_DIR), str(scratch))
    return torch.load(scratch, weights_only=False)["optimizer"]


def alternating_grades(trajs, reward) -> None:
    """A grader for `Collaborators(grade=...)`: every other trajectory of a batch correct (a random
    tiny model never answers right, so the update would have no signal). As `roll_out.grade`."""
    for i, t in enumerate(trajs):
        ok = i % 2 == 0
        t.reward, t.extracted, t.grade_reason = float(ok), "x", "correct" if ok else "wrong"


def alternating(**faults):
    """The run's collaborators with `alternating_grades` for the grader; `faults`: a
    `faults.FaultPlan`'s fields to inject."""
    from rstar2_cli.rl.run.faults import FaultPlan
    from rstar2_cli.rl.run.rollout_side import Collaborators

    return Collaborators(grade=alternating_grades, faults=FaultPlan(**faults))


def write_checkpoint(folder, step: int):
    """A small checkpoint folder laid out as rl/update/checkpoint.py writes one (HF safetensors and a DCP
    `state/`), whole as far as `--resume`'s check reads it (rl/update/checkpoint_check.py)."""
    import torch   # lazy: the other helpers here need no torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((64, 64), float(step))}, str(folder / "model-00001-of-00001.safetensors"))
    dcp.save({"m": torch.arange(4096.0) * step}, storage_writer=dcp.FileSystemWriter(str(folder / "state")),
             no_dist=True)
    return folder
