"""The policy model's pieces shared by SFT and RL: `build_tiny_model` makes the laptop-sized Qwen3 used by
tests and the quickstart; `attention` picks the attention kernel and the micro-batch layout it needs."""
from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tiny_model

__all__ = ["build_tiny_model", "build_qwen3_style_tokenizer"]
