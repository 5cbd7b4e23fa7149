"""An eval trajectories.jsonl row (eval/runner.py `sample_record`) in the RL rollout schema the page reads.

An eval row keeps the decoded response only (Trajectory.text: the generated turns and the tool turns
between them, special tokens included). It is cut into turns at the tool-response tags the chat
template writes around each tool message (protocol/template.py `TOOL_RESPONSE_OPEN`/`_CLOSE`):
`...</tool_call><|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n
<|im_start|>assistant\\n<reason>...` (protocol/responses.py `tool_turn_text`). A tool turn's status
is read from its text: the release's words (`Tool call success` / `Tool call failure` with code-judge's
reason, protocol/responses.py `release_run_text`), the rstar2 format's notes (`format_run_result`) or
a parser message (`Error: ...`, protocol/parser.py).
"""
from __future__ import annotations

import json
import re
from typing import Any

from rstar2_cli.protocol.parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from rstar2_cli.protocol.template import IM_END, IM_START, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN

RESPONSE = re.compile(re.escape(TOOL_RESPONSE_OPEN) + r"\n?(.*?)\n?" + re.escape(TOOL_RESPONSE_CLOSE), re.DOTALL)
CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.DOTALL)
CHAT_MARK = re.compile(re.escape(IM_END) + r"\s*|" + re.escape(IM_START) + r"(?:user|assistant)?\n?")
ERROR_LINE = re.compile(r"^(?:Traceback \(most recent call last\)|\w*(?:Error|Exception)\b)", re.MULTILINE)


def tool_code(turn: str) -> str | None:
    """The code of a turn's first tool call: its arguments' `code` when the call is JSON, else the
    raw text between the tags; None without a call."""
    m = CALL.search(turn)
    if not m:
        return None
    raw = m.group(1).strip()
    try:
        call = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    args = call.get("arguments") if isinstance(call, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return args
    code = args.get("code") if isinstance(args, dict) else None
    return code if isinstance(code, str) else raw


def tool_status(text: str) -> str:
    """ok, error, timeout, parse_error or infra_error, from a tool turn's text."""
    head = text.lstrip()
    if head.startswith("Tool call success"):
        return "ok"
    if head.startswith("Tool call failure"):
        reason = (head.split("\n") + [""])[1]      # `reason: <code-judge reason>`
        return "timeout" if "worker_timeout" in reason else "infra_error" if "internal_error" in reason else "error"
    if head.startswith("Error:"):
        return "parse_error"
    if head.startswith("Sandbox internal error"):
        return "infra_error"
    if "TimeoutError: execution exceeded the time limit" in text:
        return "timeout"
    return "error" if ERROR_LINE.search(text) else "ok"


def split_turns(text: str) -> list[dict[str, Any]]:
    """The assistant and tool turns of a decoded response, chat markers removed."""
    turns: list[dict[str, Any]] = []
    pos = 0

    def assistant(chunk: str) -> None:
        clean = CHAT_MARK.sub("", chunk).strip("\n")
        if clean.strip():
            turns.append({"role": "assistant", "text": clean, "tokens": None, "tool_code": tool_code(clean),
                          "parse_error": None})

    for m in RESPONSE.finditer(text):
        assistant(text[pos:m.start()])
        body = m.group(1)
        turns.append({"role": "tool", "text": body, "tokens": None, "status": tool_status(body)})
        pos = m.end()
    assistant(text[pos:])
    return turns


def eval_trajectory(row: dict[str, Any], benchmark: str) -> dict[str, Any]:
    """The row as the page's trajectory: turns cut from its text, grade and counts as written."""
    turns = split_turns(str(row.get("text") or ""))
    return {"step": None, "node": None, "benchmark": benchmark, "group": row.get("problem_id"),
            "prompt_id": row.get("problem_id"), "sample": row.get("sample_index"), "problem": row.get("problem"),
            "gold": row.get("gold"), "turns": turns, "response_tokens": row.get("response_tokens"),
            "tool_calls": row.get("tool_calls"), "tool_errors": row.get("tool_errors"), "void_turns": None,
            "finish_reason": row.get("finish_reason"), "reward": row.get("reward"), "extracted": row.get("extracted"),
            "grade_reason": row.get("grade_reason"), "fault": row.get("error"), "roc": None, "advantage": None,
            "logprob_gap": None}
