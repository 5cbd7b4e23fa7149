"""SFT conversations: read, check and tokenize the messages jsonl that `rstar2 prepare sft` writes.

Why checked here and not left to the template: a malformed row deep inside a 200K-row file would
otherwise surface as a Jinja or tokenizer traceback halfway through tokenization. Each row is
checked against the schema (`rstar2_cli.data.sft_convert.validate`, the format's single
definition) plus the tool-call shape the template relies on, and any failure is one line naming
`file:line`.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

from datasets import Dataset
from jinja2 import TemplateError
from rich.progress import Progress

from rstar2_cli.data.sft_convert import validate
from rstar2_cli.sft.masks import MaskError, conversation_ids_and_mask


class SftDataError(ValueError):
    """A row of an SFT file is unusable; the message names the file and line."""


def _check_tool_calls(row: dict[str, Any]) -> None:
    for i, m in enumerate(row["messages"]):
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise ValueError(f"message {i}: tool_calls must be a list")
        for k, call in enumerate(calls):
            fn = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise ValueError(f"message {i}: tool_calls[{k}] needs a 'name' string")
            if not isinstance(fn.get("arguments"), (dict, str)):
                raise ValueError(f"message {i}: tool_calls[{k}] needs 'arguments' (an object or a JSON string)")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError("'tools' must be a list of JSON-schema objects")


def check_row(row: Any) -> dict[str, Any]:
    """The row if it is a trainable conversation; ValueError (one line, no location) otherwise."""
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
        raise ValueError("expected an object with a 'messages' list")
    if not all(isinstance(m, dict) for m in row["messages"]):
        raise ValueError("every message must be an object")
    validate(row)
    _check_tool_calls(row)
    return row


def load_conversations(paths: list[str]) -> list[dict[str, Any]]:
    """All rows of all files, checked; each gets `_where` = "file:line" for later error messages."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise SftDataError(f"{p}: SFT data file not found")
        with p.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = check_row(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SftDataError(f"{p}:{n}: not valid JSON ({e.msg})") from None
                except ValueError as e:
                    raise SftDataError(f"{p}:{n}: {e}") from None
                row["_where"] = f"{p}:{n}"
                rows.append(row)
    if not rows:
        raise SftDataError(f"{', '.join(paths)}: no conversations")
    return rows


_TOKENIZER = None
_FORCE_REASON = True


def _init_worker(tokenizer, force_reason: bool = True) -> None:
    global _TOKENIZER, _FORCE_REASON
    _TOKENIZER, _FORCE_REASON = tokenizer, force_reason


def _tokenize_row(row: dict[str, Any]) -> tuple[list[int], list[int]] | str:
    """(ids, mask), or the one-line error for this row (returned, so it crosses process boundaries)."""
    try:
        return conversation_ids_and_mask(_TOKENIZER, row["messages"], row.get("tools"), _FORCE_REASON)
    except (MaskError, TemplateError, TypeError) as e:
        return f"{row.get('_where', '<row>')}: {e}"


def _worker_count(n_rows: int) -> int:
    """Processes for tokenizing: the CPUs this rank may use, none for small sets (startup costs more)."""
    if n_rows < 2000:
        return 0
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(0, min(16, (os.cpu_count() or 1) // local_world) - 1)


def tokenize_conversations(tokenizer, rows: list[dict[str, Any]], max_length: int, *, progress: bool = False,
                           force_reason: bool = True):
    """(`datasets.Dataset` with input_ids + assistant_masks, rows dropped because truncation left
    no assistant token). `force_reason`: as the RL recipe's rollout.force_reason. TRL turns the mask
    into labels (-100 where the mask is 0). Large sets are tokenized in worker processes (Jinja
    rendering is the bottleneck: a few hundred rows/s/core)."""
    workers = _worker_count(len(rows))
    pool = None
    if workers:
        pool = mp.get_context("fork").Pool(workers, initializer=_init_worker, initargs=(tokenizer, force_reason))
        results = pool.imap(_tokenize_row, rows, chunksize=64)
    else:
        _init_worker(tokenizer, force_reason)
        results = map(_tokenize_row, rows)
    ids_col, mask_col, dropped = [], [], 0
    try:
        with Progress(transient=True, disable=not progress) as bar:
            task = bar.add_task("tokenizing conversations", total=len(rows))
            for result in results:
                if isinstance(result, str):
                    raise SftDataError(result)
                ids, mask = result[0][:max_length], result[1][:max_length]
                if 1 in mask:
                    ids_col.append(ids)
                    mask_col.append(mask)
                else:
                    dropped += 1
                bar.advance(task)
    finally:
        if pool is not None:
            pool.terminate()
    if not ids_col:
        raise SftDataError(f"all {len(rows)} conversations have no assistant token within max_length={max_length}")
    return Dataset.from_dict({"input_ids": ids_col, "assistant_masks": mask_col}), dropped
