"""The rehearsal's policy: a tiny model that calls the Python tool on its first turn.

Why not the random tiny model: it never writes a `<tool_call>`, so the sandbox cluster would see
no call and the rehearsal would prove nothing about it. The quickstart's SFT start calls the tool,
but its 300 steps take minutes. Here the quickstart's own pieces (toy problems, SFT rows with real
tool outputs from a sandbox, a tokenizer trained on them, `sft_stage`) build a smaller start: only
the "correct" route (call, output, answer), rendered with the stage recipes' prompt (the release's
system prompt, no tool list: `rollout.tools_in_prompt=false`), a few dozen SFT steps. It need not
answer right; it must call the tool, and it does on nearly every rollout. The problems are the
toy's form with one-digit operands ("Compute 7*4+9."): the answers have one or two digits, so a
few dozen steps teach enough copying that some samples of a group are right and some wrong, and
GRPO has an update to make on every step.
"""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

from sandbox import Limits, Sandbox

from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tiny_model
from rstar2_cli.protocol.template import render_messages
from rstar2_cli.quickstart.pipeline import sft_stage
from rstar2_cli.quickstart.prepare import PreparedToy, write_jsonl
from rstar2_cli.quickstart.settings import TOY_PROTOCOL, QuickstartSettings
from rstar2_cli.quickstart.toy_sft_data import BehaviourMix, make_sft_rows
from rstar2_cli.quickstart.toy_task import ToyProblem

# The stage recipes' rollout fields the model was tuned with (the toy's tool protocol; the release's
# system prompt, which is the recipes' default; no tool schema in the prompt).
ROLLOUT_FIELDS = {**TOY_PROTOCOL, "tools_in_prompt": False}


def small_problems(seed: int, n_train: int, n_heldout: int) -> tuple[list[ToyProblem], list[ToyProblem]]:
    """(train, heldout), disjoint, of one-digit `a*b+c` problems."""
    rng = random.Random(f"rstar2-rehearsal-{seed}")
    triples = [(a, b, c) for a in range(2, 10) for b in range(2, 10) for c in range(1, 10)]
    rng.shuffle(triples)
    problems = [ToyProblem(f"small-{seed}-{i}", f"Compute {a}*{b}+{c}.", str(a * b + c), a, b, c)
                for i, (a, b, c) in enumerate(triples[:n_train + n_heldout])]
    return problems[:n_train], problems[n_train:]


def build_tool_caller(root: Path, *, sft_steps: int = 120, n_train: int = 96, n_heldout: int = 8) -> PreparedToy:
    """Toy data in root/data and the SFT'd model in root/sft/final (PreparedToy.model_dir)."""
    s = QuickstartSettings.for_preset(root, "smoke", n_train=n_train, n_heldout=n_heldout, sft_examples=n_train,
                                      sft_steps=sft_steps, mix_guess=0.0, mix_buggy_repair=0.0, mix_correct=1.0)
    train, heldout = small_problems(s.seed, s.n_train, s.n_heldout)
    data = root / "data"
    train_file, heldout_file, sft_file = data / "train.jsonl", data / "heldout.jsonl", data / "sft.jsonl"
    write_jsonl(train_file, [p.to_row() for p in train])
    write_jsonl(heldout_file, [p.to_row() for p in heldout])

    async def rows():
        async with Sandbox(workers=2, limits=Limits(timeout=5.0, cpu_time=5.0, memory_mb=512)) as box:
            return await make_sft_rows(train, s.seed, box, mix=BehaviourMix(0.0, 0.0, 1.0), max_chars=512,
                                       system_prompt=None, tools_in_prompt=False)

    sft_rows = asyncio.run(rows())
    write_jsonl(sft_file, sft_rows)
    host = build_qwen3_style_tokenizer()
    corpus = [render_messages(host, r["messages"], r.get("tools"), force_reason=TOY_PROTOCOL["force_reason"])
              for r in sft_rows]
    init = build_tiny_model(root / "model_init", seed=s.seed, vocab_size=s.vocab_size, hidden_size=s.hidden_size,
                            num_layers=s.num_layers, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                            head_dim=s.head_dim, max_position_embeddings=2048, corpus=corpus)
    prep = PreparedToy(train_file, heldout_file, sft_file, Path(init), {"correct": len(sft_rows)})
    final = sft_stage(s, prep, progress=False)
    return PreparedToy(train_file, heldout_file, sft_file, Path(final), prep.behaviours)


if __name__ == "__main__":
    import sys
    import time

    t = time.monotonic()
    print(build_tool_caller(Path(sys.argv[1]), sft_steps=int(sys.argv[2]) if len(sys.argv) > 2 else 60))
    print(f"{time.monotonic() - t:.1f} s")
