"""A Qwen3 decoder's sizes, and the parameter counts that follow from them (no torch needed).

Used by the smoke benchmark (FLOPs, benchmarks/gpu/smoke_model.py) and by the launch plan's
memory table (rstar2_cli/launch/memory_plan.py), which must run on a login node without a GPU.
Counts are by hand and checked against the model transformers builds (tests/launch).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Qwen3Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = True

    @property
    def attn_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """One decoder layer: q, k, v, o projections (no bias), q_norm and k_norm (head_dim
        each), gate/up/down of the MLP and the two RMSNorms."""
        h, a, kv = self.hidden, self.attn_dim, self.kv_dim
        attention = h * a + 2 * h * kv + a * h + 2 * self.head_dim
        return attention + 3 * h * self.intermediate + 2 * h

    def non_embedding_params(self) -> int:
        """Decoder layers + final norm."""
        return self.layers * self.layer_params() + self.hidden

    def embedding_params(self) -> int:
        """Input embedding, plus the LM head when it is its own tensor (untied)."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    def total_params(self) -> int:
        return self.non_embedding_params() + self.embedding_params()

    def root_params(self) -> int:
        """What FSDP2's root unit holds once every decoder layer is its own unit: embeddings,
        LM head and the final norm."""
        return self.embedding_params() + self.hidden

    @classmethod
    def from_hf_config(cls, config: dict) -> "Qwen3Shape":
        """From a checkpoint's config.json (Qwen3 field names; head_dim defaults to hidden / heads)."""
        heads = int(config["num_attention_heads"])
        return cls(hidden=int(config["hidden_size"]), layers=int(config["num_hidden_layers"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
                   intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                   tie_embeddings=bool(config.get("tie_word_embeddings", False)))


# Qwen3-14B(-Base), the paper's model: Qwen/Qwen3-14B-Base config.json (untied LM head).
QWEN3_14B = Qwen3Shape(hidden=5120, layers=40, heads=40, kv_heads=8, head_dim=128, intermediate=17408,
                       vocab=151936, tie_embeddings=False)


def shape_for_model(path: str) -> tuple[Qwen3Shape, str]:
    """(shape, where it came from): `path`/config.json when that file exists, else Qwen3-14B,
    the recipes' model (a stage's starting checkpoint may not exist yet when its plan is made)."""
    config = Path(path) / "config.json"
    if config.is_file():
        return Qwen3Shape.from_hf_config(json.loads(config.read_text())), str(config)
    return QWEN3_14B, f"Qwen3-14B (assumed: no {config})"
