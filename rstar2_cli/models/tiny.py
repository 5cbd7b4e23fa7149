"""Build a tiny, randomly initialised Qwen3 checkpoint with its own small tokenizer, in seconds.

Why: every stage (rollout, SFT, RL, eval, vLLM loading) must be testable on a laptop CPU with no
download. The tiny checkpoint has the same architecture class, tokenizer class (`Qwen2Tokenizer`,
byte-level BPE with Qwen's pre-tokenizer regex), special tokens and chat template as Qwen3, so
code paths are the real ones; only the sizes differ.

Token choices mirror Qwen3's tokenizer: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` are special
(eos is `<|im_end|>`, pad is `<|endoftext|>`); `<tool_call>`, `</tool_call>`, `<tool_response>`,
`</tool_response>` are single added tokens that are NOT "special" (so `decode(skip_special_tokens=True)`
keeps them, exactly as with Qwen3). `<reason>`, `</reason>`, `<answer>`, `</answer>` are single
non-special added tokens too: Qwen3 spells them with several tokens, but a tiny vocabulary wastes
its budget otherwise, and all protocol code works on text, so the difference is invisible to it.

A session-scoped pytest fixture (the lead adds it to tests/conftest.py):

    @pytest.fixture(scope="session")
    def tiny_model(tmp_path_factory):
        from rstar2_cli.models.tiny import build_tiny_model
        return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Iterable, Iterator

import torch
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import AddedToken, GenerationConfig, Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

from rstar2_cli.protocol.parser import format_tool_call
from rstar2_cli.protocol.template import USER_PROMPT, chat_template, install_chat_template
from rstar2_cli.protocol.tools import TOOLS

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PROTOCOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                   "<reason>", "</reason>", "<answer>", "</answer>"]
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128)
# Qwen2/Qwen3's pre-tokenizer split (single digits, letters runs, punctuation runs, newlines).
QWEN_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                          r"""\s*[\r\n]+|\s+(?!\S)|\s+""")

_CODE_SNIPPETS = [
    "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - {a}*x + {b}, x))",
    "from math import comb, gcd\nprint(comb({a}, {c}), gcd({a}, {b}))",
    "total = 0\nfor i in range(1, {a} + 1):\n    if i % {c} == 0:\n        total += i\nprint(total)",
    "n = int(input())\nprint(sum(int(d) for d in str(n ** {c})))",
    "def f(n):\n    return n * (n + 1) // 2\n\nprint(f({a}) - f({b}))",
    "import itertools\ncount = sum(1 for p in itertools.permutations(range({c})) if p[0] < p[-1])\nprint(count)",
    "from fractions import Fraction\nprint(Fraction({a}, {b}) + Fraction(1, {c}))",
    "import numpy as np\nA = np.array([[{a}, {b}], [{c}, 1]])\nprint(round(np.linalg.det(A)))",
]
_PROBLEMS = [
    "What is ${a} + {b}$?", "Compute $\\binom{{{a}}}{{{c}}}$.", "Find the remainder when ${a}^{c}$ is divided by {b}.",
    "Let $x^2 - {a}x + {b} = 0$. Find the sum of the roots.", "How many positive divisors does ${a}$ have?",
    "A rectangle has sides {a} and {b}. What is its area?", "Solve for $x$: ${c}x + {a} = {b}$.",
    "What is the greatest common divisor of {a} and {b}?", "Find $\\frac{{{a}}}{{{b}}} + \\frac{{1}}{{{c}}}$.",
]
_REASONS = [
    "We need to compute this carefully. Let me use Python to check the arithmetic.",
    "First, note that the expression factors. I will verify the value with code.",
    "The answer follows from the formula; let me double-check by brute force.",
    "Let me set up the equation and solve it step by step.",
]


def default_corpus(seed: int = 0, lines: int = 1200) -> Iterator[str]:
    """Synthetic text in our formats: prompts, reasoning, tool calls and responses, math and code."""
    rng = random.Random(seed)
    yield chat_template()
    for tool in TOOLS.values():
        yield json.dumps(tool.schema(), ensure_ascii=False)
    for _ in range(lines):
        a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 9)
        problem = rng.choice(_PROBLEMS).format(a=a, b=b, c=c)
        code = rng.choice(_CODE_SNIPPETS).format(a=a, b=b, c=c)
        call = format_tool_call("python_code_with_standard_io", {"code": code, "input": str(a)})
        value = rng.randint(-9999, 99999)
        yield USER_PROMPT.format(problem=problem)
        yield (f"<reason>{rng.choice(_REASONS)}</reason>\n<tool_call>\n{call}\n</tool_call>"
               f"\n<tool_response>\n{value}\n</tool_response>\n"
               f"<reason>The result is {value}.</reason>\n<answer>The answer is $\\boxed{{{value}}}$.</answer>")
        if rng.random() < 0.2:
            yield (f"Traceback (most recent call last):\n  File \"<string>\", line {c}, in <module>\n"
                   f"NameError: name 'x{b}' is not defined")


def build_tokenizer(corpus: Iterable[str], vocab_size: int):
    """Train a byte-level BPE on `corpus` and wrap it as a Qwen2Tokenizer with our chat template."""
    n_added = len(SPECIAL_TOKENS) + len(PROTOCOL_TOKENS)
    if vocab_size < 256 + n_added + 16:
        raise ValueError(f"vocab_size must be >= {256 + n_added + 16} (256 bytes + added tokens), got {vocab_size}")
    bpe = Tokenizer(BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_added, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    # The protocol tags become single added tokens: keep them out of the BPE statistics.
    tags = SPECIAL_TOKENS + PROTOCOL_TOKENS

    def strip_tags(texts: Iterable[str]) -> Iterator[str]:
        for t in texts:
            for tag in tags:
                t = t.replace(tag, " ")
            yield t
    bpe.train_from_iterator(strip_tags(corpus), trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    for t in SPECIAL_TOKENS:   # fixed id order, as in Qwen3: <|endoftext|>, <|im_start|>, <|im_end|>
        vocab[t] = len(vocab)

    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PROTOCOL_TOKENS])
    install_chat_template(tok)
    return tok


# Qwen3's added-token table, in id order (151643...), with its "special" flags: the tool tags and
# <think> are NOT special there.
QWEN3_ADDED_TOKENS = [(t, True) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")] + [(t, False) for t in (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>")]


def build_qwen3_style_tokenizer():
    """A byte-level Qwen2Tokenizer with no merges and Qwen3's exact added-token table and flags.

    For tests that must hold for real Qwen3 checkpoints without downloading one: it tokenizes
    differently from the tiny tokenizer (no merges, other ids, no <reason>/<answer> tokens) but has
    the same conventions (eos <|im_end|>, pad <|endoftext|>, non-special tool tags). Its own chat
    template is deliberately NOT ours, as with a stock Qwen3 tokenizer.
    """
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for tok, special in QWEN3_ADDED_TOKENS:
        if special:
            vocab[tok] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    for t, special in QWEN3_ADDED_TOKENS:
        tok.add_tokens([AddedToken(t, special=special, normalized=False)], special_tokens=special)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"   # a foreign template
    return tok


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 512, hidden_size: int = 128,
                     num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 32,
                     intermediate_size: int | None = None, max_position_embeddings: int = 32768,
                     corpus: Iterable[str] | None = None) -> Path:
    """Write a loadable HF folder (safetensors, config, tokenizer, generation_config) and return it.

    Deterministic: the same arguments give byte-identical weights and tokenizer files.
    """
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {VLLM_CPU_HEAD_DIMS} (vLLM CPU attention), got {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer(default_corpus(seed) if corpus is None else corpus, vocab_size)
    vocab = tok.get_vocab()
    eos_ids = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    # No padding rows: a random model must never sample an id the tokenizer cannot decode.
    config = Qwen3Config(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size or 3 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=head_dim, max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos_ids[0], pad_token_id=vocab["<|endoftext|>"],
        torch_dtype="float32", use_cache=True,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=vocab["<|endoftext|>"],
                                               bos_token_id=None, do_sample=True, temperature=1.0, top_p=1.0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
