"""Extract Hermes tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) from a turn.

Why every malformed call becomes a record and not an exception: the paper feeds a parse failure
back to the model as its tool response, so the policy learns the format from short, specific
messages (which key is missing, which tool is unknown). Calls beyond the per-turn cap are answered
the same way instead of being dropped silently.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from rstar2_cli.protocol.tools import ToolSpec

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_TAG = re.compile(re.escape(TOOL_CALL_OPEN) + "|" + re.escape(TOOL_CALL_CLOSE))
_FORMAT_HINT = 'Write {"name": <function-name>, "arguments": <args-json-object>} inside <tool_call></tool_call>.'


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]   # validated against the tool's schema, defaults filled
    raw: str                    # the text between the tags


@dataclass(frozen=True)
class ParseError:
    message: str                # returned to the model as the tool response
    raw: str


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The JSON body of a call, byte-identical to what the chat template renders for `tool_calls`."""
    return json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)


def _parse_block(raw: str, tools: Mapping[str, ToolSpec]) -> ToolCall | ParseError:
    body = raw.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ParseError(f"Error: the tool call is not valid JSON ({e.msg} at line {e.lineno} "
                          f"column {e.colno}). {_FORMAT_HINT}", raw)
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return ParseError(f'Error: a tool call must be a JSON object with "name" and "arguments" keys. '
                          f"{_FORMAT_HINT}", raw)
    extra = [k for k in obj if k not in ("name", "arguments")]
    if extra:
        return ParseError(f'Error: unexpected key "{extra[0]}" in the tool call; only "name" and '
                          f'"arguments" are allowed.', raw)
    name = obj["name"]
    if not isinstance(name, str) or name not in tools:
        return ParseError(f"Error: unknown tool {json.dumps(name, ensure_ascii=False)}. "
                          f"Available tools: {', '.join(tools)}.", raw)
    arguments, error = tools[name].check_arguments(obj["arguments"])
    if error is not None:
        return ParseError(error, raw)
    return ToolCall(name=name, arguments=arguments, raw=raw)


def parse_tool_calls(text: str, tools: Mapping[str, ToolSpec],
                     max_calls: int) -> list[ToolCall | ParseError]:
    """All call attempts of one turn, in order; empty when the turn has no tool-call tag at all.

    Attempts beyond `max_calls` are ParseErrors telling the model the limit. A `<tool_call>` opened
    again before being closed, or never closed, is an "unclosed" error; a `</tool_call>` with no
    opening tag is an error too (the model tried to call but broke the format).
    """
    if max_calls < 1:
        raise ValueError(f"max_calls must be >= 1, got {max_calls}")
    attempts: list[ToolCall | ParseError] = []
    open_at: int | None = None
    for m in _TAG.finditer(text):
        if m.group() == TOOL_CALL_OPEN:
            if open_at is not None:
                attempts.append(ParseError("Error: <tool_call> was not closed with </tool_call> before "
                                           "the next <tool_call>.", text[open_at:m.start()]))
            open_at = m.end()
        elif open_at is None:
            attempts.append(ParseError("Error: found </tool_call> without a matching <tool_call>. "
                                       + _FORMAT_HINT, text[:m.start()][-200:]))
        else:
            attempts.append(_parse_block(text[open_at:m.start()], tools))
            open_at = None
    if open_at is not None:
        attempts.append(ParseError("Error: <tool_call> was not closed with </tool_call>.", text[open_at:]))
    for i in range(max_calls, len(attempts)):
        attempts[i] = ParseError(f"Error: too many tool calls in one turn; only the first {max_calls} "
                                 f"are run. Make one call, read its result, then continue.", attempts[i].raw)
    return attempts
