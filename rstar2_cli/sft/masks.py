"""Token ids and loss masks for a conversation, rendered with the RL chat template.

Why prefix rendering instead of TRL's `{% generation %}` masks: the mask must match the RL token
layout exactly, and our template is the single source of that layout. The conversation text is
cut at each assistant message's boundaries, found by rendering the conversation up to it (with
the generation prompt `<|im_start|>assistant\\n`) and including it. The pieces are tokenized one
by one, exactly as the agent loop builds an RL trajectory (the prompt, the model's turn, each
tool-response turn are separate token runs), so a merge across a boundary can never move a token
between trained and untrained text.

Trained (mask 1): each assistant message's content, its tool calls and its closing `<|im_end|>`
(so the model learns to stop). Not trained (mask 0): the system prompt and tool list, user turns,
tool responses, the assistant header `<|im_start|>assistant\\n` with its forced `<reason>` (the
release's template writes it; in RL the policy never samples it) and the `\\n` after a final
`<|im_end|>`. If the template ever stopped being
prefix-stable, `MaskError` is raised instead of training on a wrong mask.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from rstar2_cli.protocol.template import IM_END, render_messages


class MaskError(ValueError):
    """The conversation cannot be masked (no assistant turn, or the template is not prefix-stable)."""


def assistant_spans(tokenizer, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None = None,
                    force_reason: bool = True) -> tuple[str, list[tuple[int, int]]]:
    """(full rendered text, [(start, end) character spans of trained assistant text]).
    `force_reason` must be the RL recipe's rollout.force_reason."""
    if not messages:
        raise MaskError("empty conversation")
    msgs = [dict(m) for m in messages]
    full = render_messages(tokenizer, msgs, tools, force_reason=force_reason)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(msgs):
        if m.get("role") != "assistant":
            continue
        before = render_messages(tokenizer, msgs[:i], tools, add_generation_prompt=True, force_reason=force_reason)
        upto = render_messages(tokenizer, msgs[: i + 1], tools, force_reason=force_reason)
        end = upto.rfind(IM_END)
        if end < len(before):
            raise MaskError(f"message {i}: the rendered assistant turn has no {IM_END}")
        end += len(IM_END)
        # Through its <|im_end|> the turn must render the same in the whole conversation (what
        # follows it differs: a tool turn starts right after it, a last turn adds a newline).
        if not (full.startswith(upto[:end]) and upto.startswith(before)):
            raise MaskError(f"message {i}: the chat template is not prefix-stable here; cannot mask")
        spans.append((len(before), end))
    if not spans:
        raise MaskError("no assistant message to train on")
    return full, spans


def conversation_ids_and_mask(tokenizer, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None = None,
                              force_reason: bool = True) -> tuple[list[int], list[int]]:
    """(input_ids, assistant_mask) for a whole conversation; mask 1 = trained token."""
    full, spans = assistant_spans(tokenizer, messages, tools, force_reason)
    ids: list[int] = []
    mask: list[int] = []

    def add(text: str, bit: int) -> None:
        if text:
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids.extend(piece)
            mask.extend([bit] * len(piece))

    cursor = 0
    for start, end in spans:
        add(full[cursor:start], 0)
        add(full[start:end], 1)
        cursor = end
    add(full[cursor:], 0)
    return ids, mask
