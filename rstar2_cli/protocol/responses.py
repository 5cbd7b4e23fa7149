"""Turn tool outcomes into the text and token ids the model sees in the next user turn.

Two response formats (rollout.response_format):
- "release" (default): the official release's text. Its code tool (rstar2_agent/tools/
  code_judge_utils.py) answers `Tool call success` or `Tool call failure` + `reason: <code-judge
  reason>`, then `stdout: ...`, `stderr: ...` (each only when non-empty) and `execution time:
  X.XXs`, one per line; verl's agent loop then cuts a response longer than
  multi_turn.max_tool_response_length (256) in the middle, around "...(truncated)...".
  Parse errors come from the parser as they are, uncut (verl cuts only executed calls).
- "rstar2": the raw stdout and stderr with short notes for limits, cut head+tail with a marker
  that says how many characters were dropped.

Why the ids are cut out of a template render instead of being written by hand: the trainer scores
`prompt + generated + tool` ids as one sequence, and the SFT data is rendered by the template. If the
tool turn were assembled separately, a newline or tag out of place would make RL contexts differ from
everything the model was trained on. Here the template is the one source of the layout.
"""
from __future__ import annotations

from typing import Any

from rstar2_cli.protocol.parser import ParseError
from rstar2_cli.protocol.template import IM_END, IM_START, render_messages
from sandbox.core.result import codejudge_reason

NO_OUTPUT = "(no output; use print() to show results)"
RELEASE_CUT = "...(truncated)..."          # verl tool_agent_loop, tool_response_truncate_side "middle"
# Our sandbox's reasons become code-judge's ResultReason values through the one map the sandbox's
# code-judge API uses (sandbox.core.result.codejudge_reason): a snippet that raises or hits a
# resource limit is a plain failure (''), a time-out 'worker_timeout', the machinery 'internal_error'.



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


def truncate_release(text: str, max_chars: int) -> str:
    """verl's middle cut: the first and last max_chars // 2 characters around "...(truncated)..."."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + RELEASE_CUT + text[-half:]


def release_run_text(result: Any) -> str:
    """A sandbox RunResult in the release's words (code_judge_utils.run_tool_calls_on_server_async)."""
    if result.reason == "ok":
        parts = ["Tool call success"]
    else:
        parts = ["Tool call failure", f"reason: {codejudge_reason(result.reason)}"]
    if result.stdout:
        parts.append(f"stdout: {result.stdout}")
    if result.stderr:
        parts.append(f"stderr: {result.stderr}")
    parts.append(f"execution time: {result.wall_time:.2f}s")
    return "\n".join(parts)


def format_run_result(result: Any, timeout: float | None = None) -> str:
    """rstar2 format: stdout first, then errors and limit messages."""
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


def response_text(outcome: Any, max_chars: int, timeout: float | None = None, style: str = "release") -> str:
    """The text for one call: a ParseError's message or a RunResult's output, in `style`
    ("release" or "rstar2", rollout.response_format), cut to max_chars."""
    if style == "release":
        if isinstance(outcome, ParseError):
            return outcome.message
        return truncate_release(release_run_text(outcome), max_chars)
    if style != "rstar2":
        raise ValueError(f"response style must be 'release' or 'rstar2', got {style!r}")
    text = outcome.message if isinstance(outcome, ParseError) else format_run_result(outcome, timeout)
    return truncate_middle(text, max_chars)


def tool_messages(texts: list[str]) -> list[dict[str, str]]:
    return [{"role": "tool", "content": t} for t in texts]


def tool_turn_text(tokenizer, texts: list[str], force_reason: bool = True) -> str:
    """What follows a generated turn's `<|im_end|>` when tool results come back:
    `<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n<reason>`.
    Cut out of a render of the tool messages alone, as the release's loop does (it renders them with
    the generation prompt and drops the system block the template puts first)."""
    if not texts:
        raise ValueError("tool_turn_text: no tool responses")
    full = render_messages(tokenizer, tool_messages(texts), add_generation_prompt=True, force_reason=force_reason)
    system_end = full.find(IM_END + "\n")       # the default system block comes first
    if not full.startswith(IM_START + "system\n") or system_end < 0:
        raise RuntimeError("chat template: a tool turn's render does not start with the system block")
    return full[system_end + len(IM_END) + 1:]


def tool_turn_ids(tokenizer, texts: list[str], after_eos: bool = True, force_reason: bool = True) -> list[int]:
    """Token ids to append after a generated turn. `after_eos`: the turn ended on an end-of-turn
    token the policy sampled (the release's only way to end a turn); otherwise (it stopped at
    `</tool_call>`, rollout.stop_at_tool_call) the ids start with the `<|im_end|>` it did not write."""
    text = tool_turn_text(tokenizer, texts, force_reason)
    return tokenizer.encode(text if after_eos else IM_END + text, add_special_tokens=False)
