"""Extract Hermes tool calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) from a turn.

Why every malformed call becomes a record and not an exception: the paper feeds a parse failure
back to the model as its tool response. Two wordings (rollout.parse_messages):
- "release" (default): the release's rstar2_agent_hermes parser (rstar2_agent/tools/tool_parser.py)
  and verl's `_call_tool`. A turn needs both tags or it has no call; each `<tool_call>(.*?)</tool_call>`
  that is not JSON with "name" and "arguments" is answered "Failed to decode tool call: <error>"; an
  unknown tool or unusable arguments "Error when executing tool: <error>"; a missing argument
  defaults to ""; calls beyond the cap are dropped.
- "strict" (ours): short, specific messages (which key is missing, which tool is unknown, which
  argument has the wrong type), and calls beyond the cap are answered instead of dropped.
rollout.unclosed_tag_feedback answers an unclosed or unmatched tag with an error (the release ends
the trajectory there, as a turn without a call).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from rstar2_cli.protocol.tools import ToolSpec

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_TAG = re.compile(re.escape(TOOL_CALL_OPEN) + "|" + re.escape(TOOL_CALL_CLOSE))
_RELEASE_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)   # tool_parser.py's regex
_UNCLOSED = "Error: <tool_call> was not closed with </tool_call>."
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


class FunctionCall(BaseModel):
    """verl's FunctionCall (name and JSON arguments as strings): its validation errors are the release's text."""
    name: str
    arguments: str


def _release_block(raw: str, tools: Mapping[str, ToolSpec]) -> ToolCall | ParseError:
    try:
        obj = json.loads(raw)
        FunctionCall(name=obj["name"], arguments=json.dumps(obj["arguments"], ensure_ascii=False))
    except (ValueError, KeyError, TypeError, IndexError, ValidationError) as e:
        return ParseError(f"Failed to decode tool call: {e}", raw)
    name, arguments = obj["name"], obj["arguments"]
    if name not in tools:
        return ParseError(f"Error when executing tool: {KeyError(name)}", raw)
    if not isinstance(arguments, dict):         # the tool's `parameters.get("code", "")`
        return ParseError(f"Error when executing tool: '{type(arguments).__name__}' object has no attribute 'get'", raw)
    spec = tools[name]
    filled = {k: arguments.get(k, "") for k in spec.parameters.get("properties", {})}
    for key, value in filled.items():
        if not isinstance(value, str):  # the code template's `.encode()` of the argument
            return ParseError(
                f"Error when executing tool: '{type(value).__name__}' object has no attribute 'encode'", raw
            )
    return ToolCall(name=name, arguments=filled, raw=raw)


def _release_attempts(text: str, tools: Mapping[str, ToolSpec], unclosed_feedback: bool) -> list[ToolCall | ParseError]:
    attempts: list[ToolCall | ParseError] = []
    if TOOL_CALL_OPEN in text and TOOL_CALL_CLOSE in text:
        attempts = [_release_block(m.group(1), tools) for m in _RELEASE_CALL.finditer(text)]
    if unclosed_feedback:
        tail = text[text.rfind(TOOL_CALL_CLOSE) + len(TOOL_CALL_CLOSE):] if TOOL_CALL_CLOSE in text else text
        if TOOL_CALL_OPEN in tail:
            attempts.append(ParseError(_UNCLOSED, tail[tail.find(TOOL_CALL_OPEN) + len(TOOL_CALL_OPEN):]))
    return attempts


def _strict_attempts(text: str, tools: Mapping[str, ToolSpec], unclosed_feedback: bool) -> list[ToolCall | ParseError]:
    attempts: list[ToolCall | ParseError] = []
    open_at: int | None = None
    for m in _TAG.finditer(text):
        if m.group() == TOOL_CALL_OPEN:
            if open_at is not None and unclosed_feedback:
                attempts.append(ParseError("Error: <tool_call> was not closed with </tool_call> before "
                                           "the next <tool_call>.", text[open_at:m.start()]))
            open_at = m.end()
        elif open_at is None:
            if unclosed_feedback:
                attempts.append(ParseError("Error: found </tool_call> without a matching <tool_call>. "
                                           + _FORMAT_HINT, text[:m.start()][-200:]))
        else:
            attempts.append(_parse_block(text[open_at:m.start()], tools))
            open_at = None
    if open_at is not None and unclosed_feedback:
        attempts.append(ParseError(_UNCLOSED, text[open_at:]))
    return attempts


def parse_tool_calls(text: str, tools: Mapping[str, ToolSpec], max_calls: int, *, messages: str = "release",
                     unclosed_feedback: bool = False) -> list[ToolCall | ParseError]:
    """All call attempts of one turn, in order; empty when the turn has no call (it ends the trajectory).

    `messages`: "release" or "strict" (module docstring). At most `max_calls` attempts are kept; in
    strict mode the ones beyond are ParseErrors telling the model the limit. `unclosed_feedback`:
    a `<tool_call>` never closed (or, strict, opened again before being closed, or a `</tool_call>`
    with no opening tag) is an error record instead of being ignored.
    """
    if max_calls < 1:
        raise ValueError(f"max_calls must be >= 1, got {max_calls}")
    if messages == "release":
        return _release_attempts(text, tools, unclosed_feedback)[:max_calls]
    if messages != "strict":
        raise ValueError(f"parse messages must be 'release' or 'strict', got {messages!r}")
    attempts = _strict_attempts(text, tools, unclosed_feedback)
    for i in range(max_calls, len(attempts)):
        attempts[i] = ParseError(f"Error: too many tool calls in one turn; only the first {max_calls} "
                                 f"are run. Make one call, read its result, then continue.", attempts[i].raw)
    return attempts
