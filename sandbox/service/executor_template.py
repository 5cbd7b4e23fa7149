"""The rStar release's executor template: our writing of it, and the preludes a service's pool knows.

Why: the release's client (microsoft/rStar `rstar2_agent/tools/code_judge_utils.py`) does not send
the model's code as is; it sends a stdlib-only executor script (a prelude defining an error class
and a notebook-like executor, then one cell per code block, each a base64 payload). Run as text,
every call pays that prelude in its fresh child: imports, two class definitions, `ast.parse` and
two `compile`s of the payload. A pool that has the prelude registered (sandbox.core.preludes)
recognises it exactly and runs it once per zygote instead (sandbox.inside.template_run); the
output is the same bytes. The service registers `CODEJUDGE_PRELUDES` on every pool it builds
(sandbox.service.embedded), for code-judge compatibility.

`CODEJUDGE_PRELUDES`: the prelude `wrap_code` writes (tests and `bench-tools --client codejudge`
use it), and the release's `code_template_setup` itself, known here only by its length and digest
(taken from that file at microsoft/rStar 73b21b5, which matches the release's `ecbfb94` tool code).

The script here is written from the release's documented behaviour, not copied from it:

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

import base64

from sandbox.core.preludes import PreludeDigest

EXECUTOR_PRELUDE = r'''
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
    return EXECUTOR_PRELUDE + "".join(cells) + _CELL.format(payload=_b64(code), quiet=False)


# the release's code_template_setup (rstar2_agent/tools/code_judge_utils.py, microsoft/rStar)
RELEASE_PRELUDE = PreludeDigest(6176, "4f815061cbcf4e09c894e85eb0dc4095d7aed348d8644b1a4c55cad5496ab976", "\nimport ")
CODEJUDGE_PRELUDES = (EXECUTOR_PRELUDE, RELEASE_PRELUDE)
