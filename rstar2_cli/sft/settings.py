"""The SFT recipe: the paper's non-reasoning SFT hyperparameters as defaults.

rStar2-Agent's SFT (paper §4): 165K function-call + 30K instruction-following + 27K chat
examples, 3 epochs, lr 5e-6, 4 % warm-up, cosine decay, batch 128. It teaches the tool-call
format and instruction following only; reasoning is left to RL.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rstar2_cli.config import first_error
from rstar2_cli.recipe_text import apply_overrides, read_yaml_mapping


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_S):
    r: int = Field(0, ge=0)                      # 0 = full fine-tuning
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | str = "all-linear"
    merge: bool = True                           # merge into a plain HF checkpoint vLLM serves


class SftConfig(_S):
    name: str = "sft"
    model: str = "Qwen/Qwen3-14B-Base"
    data: list[str] = Field(default_factory=lambda: ["data/sft.jsonl"])   # our messages jsonl files
    out_dir: str = "runs/sft"
    epochs: float = Field(3.0, gt=0)
    max_steps: int = -1                          # > 0 overrides epochs
    lr: float = Field(5e-6, gt=0)
    warmup_ratio: float = Field(0.04, ge=0, lt=1)   # a fraction of all steps (transformers: warmup_steps < 1)
    lr_scheduler: Literal["cosine", "linear", "constant_with_warmup"] = "cosine"
    batch_size: int = Field(128, ge=1)           # global batch (per-device x accumulation x devices)
    per_device_batch_size: int = Field(4, ge=1)
    max_length: int = Field(8192, ge=16)
    packing: bool = False                        # honoured with flash_attention_2 only (see trainer.py)
    # auto: flash_attention_2 where flash-attn runs (CUDA/ROCm, bf16), else sdpa (rstar2_cli/models/attention.py)
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa"] = "auto"
    gradient_checkpointing: bool = True
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    seed: int = 0
    logging_steps: int = Field(10, ge=1)
    save_steps: int = Field(500, ge=1)           # HF-format checkpoints in out_dir/checkpoint-N
    save_total_limit: int | None = Field(2, ge=1)  # keep the newest N of them
    weight_decay: float = Field(0.0, ge=0)
    force_reason: bool = True                    # as the RL recipe's rollout.force_reason: assistant turns open
                                                 # with the release template's `<reason>` (mask 0)
    fsdp: bool = False                           # FSDP2 across torchrun/accelerate ranks (see trainer.py)
    lora: LoraSettings = LoraSettings()

    @field_validator("data", mode="before")
    @classmethod
    def _one_file_is_a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


def load_sft_config(path: str | Path | None, overrides: list[str] | None = None) -> SftConfig:
    """The recipe at `path` (or the defaults) with `--set a.b=value` overrides; ConfigError if invalid."""
    raw: dict[str, Any] = read_yaml_mapping(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    raw = apply_overrides(raw, list(overrides or []))
    try:
        return SftConfig.model_validate(raw)
    except ValidationError as e:
        raise first_error(e, source) from None
