"""Quickstart sizes and the toy recipes derived from them, validated at construction.

Why a preset plus overrides: `rstar2 quickstart` must run with no arguments (the `full` preset,
sized to finish in about a quarter of an hour on a 2-core laptop), CI needs the same pipeline in
a few minutes (`smoke`), and anyone tuning needs to change one number without editing code.

Why a short system prompt and no tool list in the toy prompt: the paper's system prompt plus the
tool schema is ~630 tokens with the tiny tokenizer, which makes every CPU forward pass ~4x slower.
The toy recipe sets `rollout.system_prompt` and `rollout.tools_in_prompt: false`, and the SFT
data is rendered with the same two settings, so SFT, RL and eval see one token layout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_cli.config import Temperature

TOY_SYSTEM_PROMPT = "You may call the python tool. Put the final answer in \\boxed{}."
# The toy's tool protocol (rollout fields; see config.PROTOCOL_FIELDS), shared by its SFT data, RL
# and held-out eval: rstar2's short error texts and no forced <reason> (the toy model was tuned on
# them; the release's protocol is the default everywhere else).
TOY_PROTOCOL: dict[str, Any] = {"max_calls_per_turn": 1, "tool_timeout": 5.0, "tool_response_max_chars": 512,
                                "force_reason": False, "response_format": "rstar2", "parse_messages": "strict",
                                "unclosed_tag_feedback": True, "stop_at_tool_call": True,
                                "code_runner": "plain"}

# Each preset: problems, model size, SFT and RL lengths. `full` is the default quickstart.
PRESETS: dict[str, dict[str, Any]] = {
    # 450 SFT steps: a sharper copier repairs as reliably as it calls cleanly at the RL temperature
    # (seed 1 at T = 1, with the mix below: repair route 94.5 % right, clean call 94 %; at 300 steps
    # on the earlier 0.25 / 0.25 mix, 71 % / 71 %, and 50 % of typo-first calls; docs/quickstart.md)
    "full": dict(n_train=2000, n_heldout=100, sft_examples=1500, sft_steps=450, rl_steps=24,
                 prompts_per_step=32, eval_every=4, eval_samples=1),
    "smoke": dict(n_train=1500, n_heldout=64, sft_examples=1500, sft_steps=300, rl_steps=6,
                  prompts_per_step=32, eval_every=3, eval_samples=1),
}


class QuickstartSettings(BaseModel):
    """Everything one quickstart run needs; `for_preset` fills sizes from PRESETS."""
    model_config = ConfigDict(extra="forbid")

    out_dir: str
    seed: int = 0
    preset: Literal["full", "smoke"] = "full"
    compare_grpo: bool = False
    # toy task
    n_train: int = Field(2000, ge=16)
    n_heldout: int = Field(100, ge=8)
    # tiny model (Qwen3 architecture, head_dim must suit vLLM's CPU attention)
    vocab_size: int = Field(1024, ge=300)
    hidden_size: int = Field(128, ge=32)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: int = 32
    # SFT (imperfect behaviour mix, see toy_sft_data.BehaviourMix)
    sft_examples: int = Field(1500, ge=16)
    sft_steps: int = Field(300, ge=1)              # copying operands emerges after ~150-250 steps
    sft_lr: float = Field(3e-3, gt=0)
    sft_batch_size: int = Field(16, ge=1)
    # the typo in most tool calls: more post-error examples, fewer give-ups after an error (toy_sft_data)
    mix_guess: float = Field(0.5, ge=0)
    mix_buggy_repair: float = Field(0.35, ge=0)
    mix_correct: float = Field(0.15, ge=0)
    # RL
    rl_steps: int = Field(24, ge=1)
    prompts_per_step: int = Field(32, ge=1)
    group_size: int = Field(4, ge=2)
    rl_lr: float = Field(3e-4, gt=0)
    max_response_tokens: int = Field(200, ge=32)
    max_turns: int = Field(4, ge=1)
    max_staleness: int = Field(0, ge=0, le=8)     # asynchronous GRPO-RoC (train.max_staleness); 0 = synchronous
    partial_rollout: bool = False                  # train.partial_rollout (needs max_staleness >= 1)
    # loss.old_logprobs at max_staleness >= 1: "rollout" = Clip-Higher against the engine's log-probs
    # (a trust region for the stale step; at the toy's LR, 3e-4, k = 1 with "trainer" + TIS has
    # collapsed on both seeds of bench_async_quickstart.py, docs/async-rl.md section 6)
    async_old_logprobs: Literal["trainer", "rollout"] = "rollout"
    # held-out evaluation
    eval_every: int = Field(4, ge=1)               # RL steps between held-out curve points
    eval_samples: int = Field(1, ge=1)             # samples per held-out problem (avg@k)
    eval_temperature: Temperature = 0.6

    @model_validator(mode="after")
    def _check(self) -> "QuickstartSettings":
        if self.mix_guess + self.mix_buggy_repair + self.mix_correct <= 0:
            raise ValueError("the SFT behaviour mix (mix_*) must not be all zero")
        if self.sft_examples > self.n_train:
            raise ValueError(f"sft_examples ({self.sft_examples}) must be <= n_train ({self.n_train})")
        return self

    @classmethod
    def for_preset(cls, out_dir: str | Path, preset: str = "full", **overrides: Any) -> "QuickstartSettings":
        if preset not in PRESETS:
            raise ValueError(f"unknown quickstart preset {preset!r}: use one of {', '.join(PRESETS)}")
        values = {**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}}
        return cls(out_dir=str(out_dir), preset=preset, **values)

    @property
    def out(self) -> Path:
        return Path(self.out_dir)


def toy_rl_recipe(s: QuickstartSettings, model_path: str | Path, train_file: str | Path, out_dir: str | Path,
                  *, roc: bool = True) -> dict[str, Any]:
    """The RL recipe (a raw mapping for `load_recipe_dict`) for the toy task."""
    return {
        "name": f"quickstart-{'roc' if roc else 'grpo'}",
        "model": {"path": str(model_path), "dtype": "float32", "gradient_checkpointing": False},
        "data": {"train": str(train_file), "shuffle": True},
        "rollout": {"max_turns": s.max_turns, "max_response_tokens": s.max_response_tokens,
                    "temperature": 1.0, "top_p": 1.0, **TOY_PROTOCOL,
                    "system_prompt": TOY_SYSTEM_PROMPT, "tools_in_prompt": False},
        "engine": {"cpu_kvcache_space_gb": 1, "max_model_len": 512, "max_num_seqs": 256},
        "sandbox": {"workers": 2, "memory_mb": 512},
        "roc": {"enabled": roc, "oversample": 2},
        "optim": {"lr": s.rl_lr, "warmup_steps": 0},
        # asynchronous runs need an off-policy correction (config.py checks it): the ratio against the
        # engine's log-probs, or TIS between the engine and the recomputed proximal policy
        "loss": ({} if not s.max_staleness else {"old_logprobs": "rollout"} if s.async_old_logprobs == "rollout"
                 else {"tis": True}),
        "train": {"steps": s.rl_steps, "prompts_per_step": s.prompts_per_step, "group_size": s.group_size,
                  "micro_batch_tokens": 8192, "seed": s.seed, "save_every": 10_000, "out_dir": str(out_dir),
                  "max_staleness": s.max_staleness, "partial_rollout": s.partial_rollout},
    }
