"""Small conversations in our SFT messages format, shared by the SFT tests."""
from __future__ import annotations

import json
from pathlib import Path

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def tool_conversation(a: int, b: int) -> dict:
    """system, user, assistant tool call, tool result, final assistant answer."""
    return {"messages": [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": f"What is {a} + {b}?"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": a, "b": b}}]},
        {"role": "tool", "content": str(a + b)},
        {"role": "assistant", "content": f"The answer is {a + b}."},
    ], "tools": [ADD_TOOL]}


def chat_conversation(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Say hello {i} times."},
                         {"role": "assistant", "content": "hello " * (i % 3 + 1)}]}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def eight_rows() -> list[dict]:
    """4 tool round trips (with a tool list) and 4 plain chats (no system prompt)."""
    return [tool_conversation(i + 2, 3 * i + 1) for i in range(4)] + [chat_conversation(i) for i in range(4)]
