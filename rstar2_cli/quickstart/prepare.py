"""The quickstart's `prepare` stage: toy problems, SFT conversations and a tiny model built for them.

Why the tokenizer is trained on the rendered toy conversations: BPE then merges the fixed prompt,
the tool-call JSON boilerplate and the tags into a handful of tokens, so a whole SFT example is
~100 tokens while every digit stays a token of its own (Qwen's pre-tokenizer splits digits),
which is what lets a 2-layer model copy operands into code and the tool's output into the answer.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from sandbox import Limits, Sandbox

from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tiny_model
from rstar2_cli.protocol.template import render_messages
from rstar2_cli.quickstart.settings import TOY_PROTOCOL, TOY_SYSTEM_PROMPT, QuickstartSettings
from rstar2_cli.quickstart.toy_sft_data import BehaviourMix, make_sft_rows
from rstar2_cli.quickstart.toy_task import make_toy_split


@dataclass(frozen=True)
class PreparedToy:
    train_file: Path           # RL problems (id, problem, answer)
    heldout_file: Path         # held-out problems, disjoint from train
    sft_file: Path             # SFT conversations (messages, tools, behaviour)
    model_dir: Path            # the randomly initialised tiny model + tokenizer
    behaviours: dict[str, int] # SFT behaviour counts


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def conversation_texts(rows: list[dict[str, Any]]) -> Iterator[str]:
    """The SFT conversations rendered by our chat template: the tokenizer's training corpus.

    Rendering needs only a tokenizer object to host the template, not the tokenizer being built,
    so a merge-free byte-level one serves."""
    host = build_qwen3_style_tokenizer()
    for r in rows:
        yield render_messages(host, r["messages"], r.get("tools"), force_reason=TOY_PROTOCOL["force_reason"])


def prepare_toy(s: QuickstartSettings, root: Path) -> PreparedToy:
    train, heldout = make_toy_split(s.seed, s.n_train, s.n_heldout)
    data = root / "data"
    train_file, heldout_file, sft_file = data / "train.jsonl", data / "heldout.jsonl", data / "sft.jsonl"
    write_jsonl(train_file, [p.to_row() for p in train])
    write_jsonl(heldout_file, [p.to_row() for p in heldout])

    async def sft_rows() -> list[dict[str, Any]]:
        async with Sandbox(workers=2, limits=Limits(timeout=5.0, cpu_time=5.0, memory_mb=512)) as box:
            return await make_sft_rows(train[: s.sft_examples], s.seed, box,
                                       mix=BehaviourMix(s.mix_guess, s.mix_buggy_repair, s.mix_correct),
                                       max_chars=512, system_prompt=TOY_SYSTEM_PROMPT, tools_in_prompt=False)

    rows = asyncio.run(sft_rows())
    write_jsonl(sft_file, rows)
    behaviours: dict[str, int] = {}
    for r in rows:
        behaviours[r["behaviour"]] = behaviours.get(r["behaviour"], 0) + 1
    model_dir = build_tiny_model(root / "model_init", seed=s.seed, vocab_size=s.vocab_size,
                                 hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads,
                                 num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                                 max_position_embeddings=2048, corpus=list(conversation_texts(rows)))
    return PreparedToy(train_file, heldout_file, sft_file, Path(model_dir), behaviours)
