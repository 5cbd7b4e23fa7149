"""Converters from public function-calling / chat formats to rstar2's SFT messages format.

rStar2-Agent's SFT stage mixes tool-use data (function calling, instruction following) before
RL. Public sets come in several layouts; the SFT trainer reads one:

    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": str,
                   "tool_calls": [{"name": str, "arguments": dict}]}],   # assistant only
     "tools": [json-schema tool specs]}                                  # optional

Supported inputs (`FORMATS`): `openai` (messages with OpenAI tool_calls), `sharegpt`
(`conversations` of from human/gpt/system/function_call/observation, optional `system`/`tools`),
`glaive` (glaive-function-calling-v2: `system` "SYSTEM: ... functions" + `chat` with USER:/
ASSISTANT:/<functioncall>/FUNCTION RESPONSE:), `toolace` (`system` with a JSON tool list +
`conversations` from user/assistant/tool, calls written `[func(a=1)]`) and `apigen_mt`
(`conversations` human/gpt/function_call/observation + `tools` JSON string). A row that cannot be
converted is reported with its line number and skipped; `convert_file` returns the counts.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rstar2_cli.data.problems import DataError, iter_rows

ROLES = ("system", "user", "assistant", "tool")


class RowError(ValueError):
    """This row cannot be converted (message says why)."""


def _arguments(value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise RowError(f"tool-call arguments are not valid JSON: {e.msg}") from None
    if not isinstance(value, dict):
        raise RowError(f"tool-call arguments must be an object, got {type(value).__name__}")
    return value


def _call(name: Any, arguments: Any) -> dict:
    if not isinstance(name, str) or not name:
        raise RowError("tool call without a function name")
    return {"name": name, "arguments": _arguments(arguments)}


def _tools(value: Any) -> list[dict]:
    if value in (None, "", []):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"'tools' is not valid JSON: {e.msg}") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise RowError("'tools' must be a list of objects")
    return [t["function"] if t.get("type") == "function" and "function" in t else t for t in value]


def validate(record: dict) -> dict:
    """Check a converted record against our schema; returns it or raises RowError."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RowError("no messages")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES:
            raise RowError(f"message {i}: unknown role {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise RowError(f"message {i}: content must be a string")
        if "tool_calls" in m and m["role"] != "assistant":
            raise RowError(f"message {i}: only assistant messages may carry tool_calls")
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no assistant message to learn from")
    return record


def from_openai(row: dict) -> dict:
    out = []
    for m in row.get("messages") or []:
        msg: dict[str, Any] = {"role": m.get("role"), "content": m.get("content") or ""}
        if isinstance(msg["content"], list):  # content parts: keep the text ones
            msg["content"] = "".join(p.get("text", "") for p in msg["content"] if isinstance(p, dict))
        calls = m.get("tool_calls") or ([m["function_call"]] if m.get("function_call") else [])
        if calls:
            msg["tool_calls"] = [_call((c.get("function") or c).get("name"), (c.get("function") or c).get("arguments"))
                                 for c in calls]
        if msg["role"] == "function":
            msg["role"] = "tool"
        out.append(msg)
    return {"messages": out, "tools": _tools(row.get("tools") or row.get("functions"))}


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "observation": "tool", "tool": "tool", "function_response": "tool"}


def from_sharegpt(row: dict) -> dict:
    """ShareGPT / LLaMA-Factory layout; also APIGen-MT (same roles, `tools` as a JSON string)."""
    turns = row.get("conversations")
    if not isinstance(turns, list):
        raise RowError("missing 'conversations' list")
    messages: list[dict] = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    for i, t in enumerate(turns):
        who, value = t.get("from"), t.get("value")
        if not isinstance(value, str):
            raise RowError(f"turn {i}: 'value' must be a string")
        if who == "function_call":
            try:
                payload = json.loads(value)
            except json.JSONDecodeError as e:
                raise RowError(f"turn {i}: function_call is not valid JSON: {e.msg}") from None
            calls = [_call(c.get("name"), c.get("arguments", {}))
                     for c in (payload if isinstance(payload, list) else [payload])]
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
                messages[-1]["tool_calls"] = calls  # "gpt" thought followed by its call
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        elif who in _SHAREGPT_ROLES:
            messages.append({"role": _SHAREGPT_ROLES[who], "content": value})
        else:
            raise RowError(f"turn {i}: unknown speaker {who!r}")
    return {"messages": messages, "tools": _tools(row.get("tools"))}


_GLAIVE_TURN = re.compile(r"(USER|ASSISTANT|FUNCTION RESPONSE):\s*")
_GLAIVE_CALL = re.compile(r"<functioncall>\s*(\{.*\})\s*$", re.S)
_GLAIVE_ARGS = re.compile(r"""(\"arguments\"\s*:\s*)'(.*)'(\s*\}\s*)$""", re.S)


def _glaive_tools(system: str) -> list[dict]:
    tools, decoder, pos = [], json.JSONDecoder(), system.find("{")
    while pos != -1:  # the system prompt lists one JSON object per function after the preamble
        try:
            obj, end = decoder.raw_decode(system, pos)
        except json.JSONDecodeError:
            pos = system.find("{", pos + 1)
            continue
        if isinstance(obj, dict) and "name" in obj:
            tools.append(obj)
        pos = system.find("{", end)
    return tools


def from_glaive(row: dict) -> dict:
    system, chat = row.get("system") or "", row.get("chat")
    if not isinstance(chat, str) or not chat.strip():
        raise RowError("missing 'chat' string")
    preamble = re.sub(r"^SYSTEM:\s*", "", system.split("{", 1)[0]).strip().rstrip("-").strip()
    messages: list[dict] = [{"role": "system", "content": preamble}] if preamble else []
    parts = _GLAIVE_TURN.split(chat)
    if parts[0].strip():
        raise RowError("chat does not start with USER:/ASSISTANT:")
    for speaker, text in zip(parts[1::2], parts[2::2]):
        text = text.replace("<|endoftext|>", "").strip()
        if speaker == "USER":
            messages.append({"role": "user", "content": text})
        elif speaker == "FUNCTION RESPONSE":
            messages.append({"role": "tool", "content": text})
        elif (m := _GLAIVE_CALL.search(text)) is not None:
            raw = _GLAIVE_ARGS.sub(lambda g: g.group(1) + json.dumps(g.group(2)) + g.group(3), m.group(1))
            try:
                payload = json.loads(raw)  # arguments were a single-quoted JSON string
            except json.JSONDecodeError as e:
                raise RowError(f"<functioncall> is not valid JSON: {e.msg}") from None
            messages.append({"role": "assistant", "content": text[:m.start()].strip(),
                             "tool_calls": [_call(payload.get("name"), payload.get("arguments", {}))]})
        else:
            messages.append({"role": "assistant", "content": text})
    return {"messages": messages, "tools": _glaive_tools(system)}


def _python_calls(text: str) -> list[dict] | None:
    """`[f(a=1, b="x"), g()]` -> calls; None if the text is not such a list."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List) or not tree.elts or not all(isinstance(e, ast.Call) for e in tree.elts):
        return None
    calls = []
    for call in tree.elts:
        name = ast.unparse(call.func)
        if call.args:
            raise RowError(f"call {name}: positional arguments cannot be mapped to parameter names")
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        except ValueError:
            raise RowError(f"call {name}: argument is not a literal") from None
        calls.append(_call(name, args))
    return calls


def from_toolace(row: dict) -> dict:
    system = row.get("system") or ""
    tools: list[dict] = []
    start = system.find("[")
    if start != -1:  # "Here is a list of functions in JSON format that you can invoke:\n[...]"
        try:
            tools = _tools(json.JSONDecoder().raw_decode(system, start)[0])
        except (json.JSONDecodeError, RowError):
            tools = []
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    for i, t in enumerate(row.get("conversations") or []):
        who, value = t.get("from"), t.get("value")
        if not isinstance(value, str):
            raise RowError(f"turn {i}: 'value' must be a string")
        if who == "assistant" and (calls := _python_calls(value)) is not None:
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        elif who in ("user", "assistant", "tool"):
            messages.append({"role": who, "content": value})
        else:
            raise RowError(f"turn {i}: unknown speaker {who!r}")
    return {"messages": messages, "tools": tools}


FORMATS: dict[str, Callable[[dict], dict]] = {
    "openai": from_openai, "sharegpt": from_sharegpt, "glaive": from_glaive,
    "toolace": from_toolace, "apigen_mt": from_sharegpt,
}


def convert_row(row: dict, fmt: str) -> dict:
    """One input row -> our record (without an empty `tools`); RowError if it cannot be."""
    if fmt not in FORMATS:
        raise DataError(f"unknown SFT format {fmt!r}; choose one of {', '.join(FORMATS)}")
    record = validate(FORMATS[fmt](row))
    if not record.get("tools"):
        record.pop("tools", None)
    return record


@dataclass
class ConvertStats:
    rows: int = 0
    converted: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)  # "<file>:<line>: <reason>"


def convert_file(in_path: str | Path, out_path: str | Path, fmt: str) -> ConvertStats:
    """Convert a .jsonl/.json/.parquet file (`iter_rows` reads it, gzip-compressed or not); bad rows
    are listed in stats.errors and skipped.

    The rows go to `<out>.part`, renamed to `out_path` only when at least one converted: a file that
    cannot be read, or whose rows all fail (likely another format), raises DataError naming it and
    the first row's reason, and leaves `out_path` as it was."""
    if fmt not in FORMATS:
        raise DataError(f"unknown SFT format {fmt!r}; choose one of {', '.join(FORMATS)}")
    in_path, out_path = Path(in_path), Path(out_path)
    stats = ConvertStats()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    part = out_path.with_name(out_path.name + ".part")

    def bad_line(err: DataError) -> None:
        stats.rows += 1
        stats.skipped += 1
        stats.errors.append(str(err))

    try:
        with part.open("w", encoding="utf-8") as out:
            for lineno, row in iter_rows(in_path, on_error=bad_line):
                stats.rows += 1
                try:
                    record = convert_row(row, fmt)
                except (RowError, AttributeError, TypeError) as e:  # wrong shapes: e.g. a string turn
                    stats.skipped += 1
                    stats.errors.append(f"{in_path}:{lineno}: {e}")
                    continue
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                stats.converted += 1
        if not stats.rows:
            raise DataError(f"{in_path}: no rows")
        if not stats.converted:
            first = stats.errors[0].removeprefix(f"{in_path}:")
            raise DataError(f"{in_path}: 0 of {stats.rows} rows convert as --format {fmt} (line {first})")
        part.replace(out_path)
    finally:
        part.unlink(missing_ok=True)
    return stats
