"""Run a `python_code_with_standard_io` snippet the way the release's code tool runs it.

Why a wrapper: the release does not send the model's code as it is. Its tool
(rstar2_agent/tools/code_judge_utils.py) wraps it in an executor that prints the `repr` of a
final bare expression (even after other output) and, when the snippet raises, prints one line
`<Type> at line <n>: <message>` plus the offending source line to stderr and exits 1, instead of
Python's traceback. The model was trained on those texts, so by default (rollout.code_runner
"release") we wrap the snippet in our own runner with the same observable behaviour; "plain" sends
the snippet as it is (our sandbox's own short errors and notebook-style echo).

The behaviour reproduced, step by step: the code is parsed (a SyntaxError is reported at its
line); if the last top-level statement is an expression, the source lines before it run as the
body and its lines are evaluated on their own; a failing evaluation is retried as a statement;
an error's line is the innermost traceback frame's (plus the body's line count for the final
expression, which then usually falls outside it and leaves the message without a source line).

`sandbox/service/executor_template.py` writes the same executor a second time, shaped like the
release's own template (base64 payload, notebook class), because it benchmarks the sandbox with what
the release's client sends; this compact runner is the one RL pays for on every call. A test pins the
two together.

The runner imports base64 by name, never through `__import__`: the sandbox's static scan sends any
`__import__` to its heavy (sympy-loaded) tier, whose forks cost more, and every RL call would pay it.
Every sandbox RL calls registers this runner's text (`RUNNER_PRELUDE`, everything before the call
line) as a prelude (`Sandbox(preludes=...)`: the RL trainer's and eval's embedded pools, and
`rstar2 serve-sandbox`, which serves RL's calls over HTTP), so it runs through the template fast
path: the runner is defined once per zygote and each call's parse and compiles are done before the
fork. `tests/protocol/test_protocol_code_runner.py` checks that such a pool recognises every
program `release_runner_source` writes.
"""
from __future__ import annotations

import base64

RUNNER_PRELUDE = r'''
import ast
import base64
import sys


def _rstar2_release_runner(code):
    def fail(error, source, offset=0):
        if hasattr(error, "lineno"):
            lineno = -1 if error.lineno is None else error.lineno
        else:
            tb = error.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            lineno = tb.tb_lineno if tb is not None else -1
        if lineno != -1:
            lineno += offset
        lines = source.splitlines()
        if lineno != -1 and 0 <= lineno - 1 < len(lines):
            text = f"{type(error).__name__} at line {lineno}: {error}\n  {lines[lineno - 1]}"
        else:
            text = f"{type(error).__name__}: {error}"
        print(text, file=sys.stderr)
        raise SystemExit(1)

    scope = {"__name__": "__main__", "__file__": "<string>", "__builtins__": __builtins__}
    body, last = code, None
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        fail(error, code)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        node, lines = tree.body[-1], code.splitlines()
        end = getattr(node, "end_lineno", None) or node.lineno
        body, last = "\n".join(lines[:node.lineno - 1]), "\n".join(lines[node.lineno - 1:end])
    if body:
        try:
            exec(compile(body, "<string>", "exec"), scope)
        except Exception as error:
            fail(error, body)
    if last:
        try:
            value = eval(compile(last, "<string>", "eval"), scope)
            if value is not None:
                print(repr(value))
        except Exception:
            try:
                exec(compile(last, "<string>", "exec"), scope)
            except Exception as error:
                fail(error, last, len(body.splitlines()) if body else 0)
'''


def release_runner_source(code: str) -> str:
    """A program that runs `code` as the release's executor does (module docstring)."""
    payload = base64.b64encode(code.encode()).decode()
    return RUNNER_PRELUDE + f'_rstar2_release_runner(base64.b64decode("{payload}").decode())\n'
