"""A client that talks to a code-judge server the way rStar2-Agent's release does.

Why it exists: `rstar2 serve-sandbox` is meant as a drop-in for code-judge, and the release's
client (microsoft/rStar `rstar2_agent/tools/code_judge_utils.py`) does not send the model's code
as is. It sends a stdlib-only executor script with the code base64-encoded inside it, posts
batches to `/run/long-batch`, and resends only the calls answered `queue_timeout`. Tests and
`rstar2 bench-tools --client codejudge` use this module to see the server as that client does.
The script below is written here from the release's documented behaviour, not copied from it:

  * it imports os, base64, sys, ast, traceback, typing, linecache, types, contextlib and io;
  * each cell (earlier cells of a `jupyter_code` history, replayed silently, then the current
    one) is decoded from base64 and run in one shared namespace (`__name__ == "__main__"`,
    `__file__ == "<string>"`);
  * when a cell ends in an expression statement, the lines before it run first and the
    expression is then evaluated; a value that is not None is printed with repr(), whatever the
    cell printed before (if the expression does not evaluate, it is run as a statement);
  * a failure prints "<Type> at line <n>: <message>" plus the source line (or "<Type>: <message>"
    when the line is unknown) to stderr and ends the process with os._exit(1); in a replayed
    history cell a failure is ignored.
"""
from __future__ import annotations

import asyncio
import base64

import httpx

_PRELUDE = r'''
import os
import sys
import ast
import base64
import linecache
import traceback
from io import StringIO
from types import CodeType
from typing import Any, Optional
from contextlib import redirect_stderr, redirect_stdout


class _CellFailure(Exception):
    def __init__(self, error: Exception, source: str, offset: int = 0) -> None:
        line = getattr(error, "lineno", None)
        if line is None:
            frame = error.__traceback__
            line = -1
            while frame is not None:
                line, frame = frame.tb_lineno, frame.tb_next
        if line != -1:
            line += offset
        head = f"{type(error).__name__}: {error}"
        rows = source.splitlines()
        if line != -1 and 0 <= line - 1 < len(rows):
            head = f"{type(error).__name__} at line {line}: {error}\n  {rows[line - 1]}"
        super().__init__(head)


class _Notebook:
    def __init__(self) -> None:
        self.names = {"__name__": "__main__", "__file__": "<string>", "__builtins__": __builtins__}

    @staticmethod
    def _split(source: str) -> "tuple[str, Optional[str]]":
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            raise _CellFailure(error, source)
        if not tree.body or not isinstance(tree.body[-1], ast.Expr):
            return source, None
        node = tree.body[-1]
        rows = source.splitlines()
        first, last = node.lineno, getattr(node, "end_lineno", node.lineno)
        return "\n".join(rows[:first - 1]), "\n".join(rows[first - 1:last])

    def run(self, source: str, quiet: bool) -> None:
        try:
            body, tail = self._split(source)
            sink_out, sink_err = (StringIO(), StringIO()) if quiet else (sys.stdout, sys.stderr)
            if body:
                try:
                    with redirect_stdout(sink_out), redirect_stderr(sink_err):
                        exec(compile(body, "<string>", "exec"), self.names)
                except Exception as error:
                    raise _CellFailure(error, body)
            if tail:
                try:
                    with redirect_stdout(sink_out), redirect_stderr(sink_err):
                        value = eval(compile(tail, "<string>", "eval"), self.names)
                    if value is not None and not quiet:
                        print(repr(value), file=sys.stdout)
                except Exception:
                    try:
                        with redirect_stdout(sink_out), redirect_stderr(sink_err):
                            exec(compile(tail, "<string>", "exec"), self.names)
                    except Exception as error:
                        raise _CellFailure(error, tail, len(body.splitlines()) if body else 0)
        except Exception as error:
            if quiet:
                return
            if isinstance(error, _CellFailure):
                print(str(error), file=sys.stderr)
            else:
                traceback.print_exc(file=sys.stderr)
            os._exit(1)


_notebook = _Notebook()
'''

_CELL = '\n_cell = base64.b64decode("{payload}".encode()).decode()\n_notebook.run(_cell, quiet={quiet})\n'


def _b64(code: str) -> str:
    return base64.b64encode(code.encode()).decode()


def wrap_code(code: str, history: list[str] | tuple[str, ...] = ()) -> str:
    """The executor script the release's client sends for one `jupyter_code` call."""
    cells = [_CELL.format(payload=_b64(old), quiet=True) for old in history]
    return _PRELUDE + "".join(cells) + _CELL.format(payload=_b64(code), quiet=False)


def submission(code: str, stdin: str | None = None, history: list[str] | tuple[str, ...] = ()) -> dict:
    """One submission as the release's client builds it (`python_code_with_standard_io` carries stdin)."""
    return {"type": "python", "solution": wrap_code(code, history), "input": stdin}


async def call_long_batch(client: httpx.AsyncClient, url: str, submissions: list[dict], max_retries: int = 4,
                          backoff: float = 0.5, sleep_after_every_attempt: bool = False) -> list[dict | None]:
    """POST `submissions` to `url` (…/run/long-batch) and resend only those answered
    `queue_timeout`, up to `max_retries` attempts in all, as the release's `call_long_batch` does.
    Returns one result dict per submission (None where every attempt failed).

    The release also sleeps `backoff * 2**(attempt-1)` after every attempt, a successful one
    included; that is client-side latency the server cannot change, so it is off unless asked for.
    """
    results: list[dict | None] = [None] * len(submissions)
    todo = list(range(len(submissions)))
    for attempt in range(1, max_retries + 1):
        if not todo:
            break
        try:
            resp = await client.post(url, json={"type": "batch", "submissions": [submissions[i] for i in todo]})
            resp.raise_for_status()
            answered = resp.json()["results"]
            retry = []
            for i, result in zip(todo, answered):
                if result["reason"] == "queue_timeout":
                    retry.append(i)
                else:
                    results[i] = result
            todo = retry
            failed = bool(todo)
        except (httpx.HTTPError, ValueError, KeyError):
            failed = True
        if failed or sleep_after_every_attempt:
            await asyncio.sleep(backoff * 2 ** (attempt - 1))
    return results


def tool_response(result: dict) -> str:
    """The text the release's client makes of one result (what the model reads)."""
    good = result["run_success"] and result["success"]
    parts = ["Tool call success" if good else "Tool call failure"]
    if not good:
        parts.append(f"reason: {result['reason']}")
    if result["stdout"]:
        parts.append(f"stdout: {result['stdout']}")
    if result["stderr"]:
        parts.append(f"stderr: {result['stderr']}")
    parts.append(f"execution time: {result['cost']:.2f}s")
    return "\n".join(parts)
