"""Render conversations with the rStar2-Agent chat template (`chat_template.jinja`).

Why always pass the template explicitly: a Qwen3 tokenizer ships its own template (with `<think>`
handling); rendering through ours regardless of the tokenizer keeps prompts, SFT data and the
agent loop's tool turns byte-identical, whichever checkpoint is loaded. The template reproduces
the official release's `custom_chat_template` for everything RL renders (see its header).
"""
from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Iterable, Mapping

from rstar2_cli.protocol.detokenize import ids_decoder  # noqa: F401  (rl/logs/rollout_log.py reads it here)

# The release's system prompt (its custom_chat_template's default; the template holds the same text).
SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process is enclosed within <reason> </reason> and answer is enclosed within "
    "<answer> </answer> tags, respectively, i.e., <reason> reasoning process here </reason> <answer> "
    "answer here </answer>."
)
# The text the release's template writes after every `<|im_start|>assistant\n` it opens: the policy
# never samples it (prompt or tool-turn tokens, loss mask 0). rollout.force_reason=false drops it.
FORCED_REASON = "<reason>"
# The release's user turn: its template prefixes the user content with this instruction.
USER_PROMPT = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
    "And your final answer will be extracted automatically by the \\boxed{{}} tag.\n"
    "This is the problem:\n{problem}"
)

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# The tags around each tool message in a user turn (chat_template.jinja, the "tool" role).
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


@lru_cache(maxsize=1)
def chat_template() -> str:
    return resources.files("rstar2_cli.protocol").joinpath("chat_template.jinja").read_text()


def problem_messages(problem: str, system: str | None = None) -> list[dict[str, Any]]:
    """The first-turn messages for a math problem (the template adds the release's system prompt)."""
    msgs: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    return msgs + [{"role": "user", "content": USER_PROMPT.format(problem=problem)}]


def render_messages(tokenizer, messages: list[Mapping[str, Any]], tools: list[dict] | None = None,
                    add_generation_prompt: bool = False, force_reason: bool = True) -> str:
    """The conversation as text. Assistant messages may carry `tool_calls`
    ([{"function": {"name", "arguments"}}] or [{"name", "arguments"}]); `tool` messages carry results.
    `force_reason`: every assistant turn opens with `<reason>` written by the template (the release)."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tools=tools or None, chat_template=chat_template(),
        add_generation_prompt=add_generation_prompt, tokenize=False, force_reason=force_reason)


def encode_messages(tokenizer, messages: list[Mapping[str, Any]], tools: list[dict] | None = None,
                    add_generation_prompt: bool = False, force_reason: bool = True) -> list[int]:
    """Token ids of `render_messages` (no BOS or other added tokens: the template is complete)."""
    text = render_messages(tokenizer, messages, tools, add_generation_prompt, force_reason)
    return tokenizer.encode(text, add_special_tokens=False)


def install_chat_template(tokenizer):
    """Make our template the tokenizer's default (saved with it, so vLLM and HF users get it too)."""
    tokenizer.chat_template = chat_template()
    return tokenizer


def single_token_id(tokenizer, token: str) -> int:
    """The id of a token that must be ONE token (stop ids are matched by id, never by string)."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r}: {token!r} is not a single "
                         f"token (encodes to {ids}); add it as a special token")
    return ids[0]


def eos_token_ids(tokenizer) -> list[int]:
    """Ids that end an assistant turn for good: `<|im_end|>`, `<|endoftext|>` and the tokenizer's eos."""
    vocab = tokenizer.get_vocab()
    ids: Iterable[int | None] = (vocab.get(IM_END), vocab.get(END_OF_TEXT), tokenizer.eos_token_id)
    out: list[int] = []
    for i in ids:
        if i is not None and i not in out:
            out.append(i)
    if not out:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no eos / <|im_end|> token")
    return out
