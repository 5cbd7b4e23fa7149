"""Turn tool outcomes into the text and token ids the model sees in the next user turn.

Why the ids are cut out of a template render instead of being written by hand: the trainer scores
`prompt + generated + tool` ids as one sequence, and the SFT data is rendered by the template. If the
tool turn were assembled separately, a newline or tag out of place would make RL contexts differ from
everything the model was trained on. Here the template is the one source of the layout.
"""
from __future__ import annotations

from typing import Any

from rstar2_cli.protocol.parser import ParseError
from rstar2_cli.protocol.template import IM_END, render_messages

NO_OUTPUT = "(no output; use print() to show results)"


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of a long output (errors are at the end, set-up at the start)."""
    if len(text) <= max_chars:
        return text
    # The marker's length depends on the count it prints; size it with the worst case.
    marker_len = len(_marker(len(text)))
    keep = max(max_chars - marker_len, 0)
    head, tail = (keep + 1) // 2, keep // 2
    cut = len(text) - head - tail
    return text[:head] + _marker(cut) + (text[len(text) - tail:] if tail else "")


def _marker(cut: int) -> str:
    return f"\n...[{cut} characters truncated]...\n"


def format_run_result(result: Any, timeout: float | None = None) -> str:
    """A sandbox RunResult as the tool response text: stdout first, then errors and limit messages."""
    out, err = result.stdout or "", result.stderr or ""
    reason = result.reason
    notes = {
        "timeout": ("TimeoutError: execution exceeded the time limit"
                    + (f" of {timeout:g} seconds." if timeout else ".")),
        "memory": "MemoryError: the program exceeded the memory limit.",
        "output_limit": "OutputLimitError: the program printed too much output; it was stopped.",
        "internal_error": "Sandbox internal error.",
    }
    parts = [p for p in (out.rstrip("\n"), err.rstrip("\n")) if p]
    if reason in notes and not err.strip():   # the sandbox usually explains limits in stderr itself
        parts.append(notes[reason])
    return "\n".join(parts) if parts else NO_OUTPUT


def response_text(outcome: Any, max_chars: int, timeout: float | None = None) -> str:
    """The text for one call: a ParseError's message or a RunResult's output, middle-cut to max_chars."""
    text = outcome.message if isinstance(outcome, ParseError) else format_run_result(outcome, timeout)
    return truncate_middle(text, max_chars)


def tool_messages(texts: list[str]) -> list[dict[str, str]]:
    return [{"role": "tool", "content": t} for t in texts]


def tool_turn_text(tokenizer, texts: list[str]) -> str:
    """What the template renders after an assistant turn's content when tool results follow:
    `<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n`."""
    if not texts:
        raise ValueError("tool_turn_text: no tool responses")
    head = [{"role": "user", "content": "q"}]
    before = render_messages(tokenizer, head, add_generation_prompt=True)
    full = render_messages(tokenizer, head + [{"role": "assistant", "content": ""}] + tool_messages(texts),
                           add_generation_prompt=True)
    if not full.startswith(before):
        raise RuntimeError("chat template: a conversation's render does not extend its prefix's render")
    return full[len(before):]


def tool_turn_ids(tokenizer, texts: list[str], after_im_end: bool = False) -> list[int]:
    """Token ids to append after a generated turn. `after_im_end`: the turn already ended with the
    `<|im_end|>` token (an EOS turn with a broken call), so it is not repeated."""
    text = tool_turn_text(tokenizer, texts)
    if after_im_end:
        if not text.startswith(IM_END):
            raise RuntimeError("chat template: tool turn does not start with <|im_end|>")
        text = text[len(IM_END):]
    return tokenizer.encode(text, add_special_tokens=False)
