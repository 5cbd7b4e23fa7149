"""Zygote side of a recognised executor template: its prelude runs once, not in every call.

Why: the rStar release's client sends every call as a stdlib-only prelude (imports, an error
class, a notebook-like executor) followed by cells that hand base64 payloads to that executor
(sandbox.service.executor_template), and RL's runner is shaped alike. Run as text, each forked
child pays the prelude again, then the executor's own `ast.parse` and `compile`s of the payload:
the parser's first use in a child alone copies ~140 pages of the zygote. Here, for a prelude the
host recognised by its digest (one its caller registered: sandbox.core.preludes):

  * the zygote runs the prelude once (the first time it sees it) into a namespace that every
    child inherits;
  * per call, before the fork, it compiles the cells (the text after the prelude, at the same
    line numbers) and precomputes the parse and compiles the executor will ask for: its payloads'
    ASTs, and the body / last-expression code objects the release's split gives;
  * the child runs the cells in that namespace. The executor's calls to `compile` and `ast.parse`
    go through `_Memo`, which answers exactly those precomputed requests and passes anything else
    on to the real functions.

The template's own code does all the rest, so its output is the same bytes as running the whole
text (tests/sandbox/test_sandbox_core_templates.py runs both ways side by side). A memo miss only
costs speed. The zygote computes nothing that could print: every compile there runs with warnings
as errors, and anything that warns or fails is left to the child, which reports it as usual.
"""
from __future__ import annotations  # the same compile flags as sandbox.inside.child's (the text-as-is path)

import base64
import builtins
import gc

from sandbox.inside import child

_B64_CALL = 'b64decode("'


class _Memo:
    """`compile` and `ast.parse` for the template's globals: the precomputed answer for the
    exact same request (`table` is set per call in the child), else the real function."""

    def __init__(self, ast_module) -> None:
        self._ast = ast_module
        self.table: dict = {}

    def compile(self, source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kw):
        if type(source) is str and filename == "<string>" and not (flags or dont_inherit or kw) and optimize == -1:
            hit = self.table.get((mode, source))
            if hit is not None:
                return hit
        return builtins.compile(source, filename, mode, flags, dont_inherit, optimize, **kw)

    def parse(self, source, filename="<unknown>", mode="exec", *, type_comments=False, feature_version=None):
        if type(source) is str and filename == "<unknown>" and mode == "exec" and not type_comments \
                and feature_version is None:
            hit = self.table.get(("parse", source))
            if hit is not None:
                return hit
        return self._ast.parse(source, filename, mode, type_comments=type_comments, feature_version=feature_version)

    def __getattr__(self, name: str):  # the template's `ast.Expr` and friends
        return getattr(self._ast, name)


class Prelude:
    """One recognised prelude, run in the zygote (trusted: the host matched its SHA-256)."""

    def __init__(self, text: str) -> None:
        import ast
        self.lines = text.count("\n")
        self.memo = _Memo(ast)
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(text, child.SNIPPET, "exec"), self.namespace)
        self.namespace["compile"] = self.memo.compile
        if self.namespace.get("ast") is ast:
            self.namespace["ast"] = self.memo

    def prepare(self, code: str, length: int):
        """(compiled cells, memo table) for one call whose text is this prelude + cells, or None
        to run the text as is (cells too long to compile in the zygote, or that do not compile)."""
        cells = code[length:]
        if len(cells) > child.PRECOMPILE_MAX_CHARS:
            return None
        compiled = child.precompile("\n" * self.lines + cells)
        if compiled is None:
            return None
        # a warning is the child's to print: what warns is not precomputed
        return compiled, child.warnings_as_errors(_table, cells, self.memo._ast)


class Preludes:
    """The preludes one zygote has run, by digest (None: it failed to, and its calls run as text)."""

    def __init__(self) -> None:
        self._known: dict[str, Prelude | None] = {}

    def prepare(self, req: dict):
        """(prelude, compiled cells, memo table) for a request the host marked `template`, or None
        to run its text as is. The first request with a prelude runs that prelude here."""
        digest, length = req["template"]
        if digest not in self._known:
            try:
                self._known[digest] = Prelude(req["code"][:length])
            except BaseException:  # noqa: BLE001 - a registered prelude that fails: run its calls as text
                self._known[digest] = None
            gc.freeze()  # its objects join the rest of the zygote's, out of the children's collections
        prelude = self._known[digest]
        prepared = prelude.prepare(req["code"], length) if prelude is not None else None
        return None if prepared is None else (prelude, *prepared)


def _table(cells: str, ast) -> dict:
    """What the executor will ask `compile`/`ast.parse` for each payload in `cells`."""
    table: dict = {}
    start = cells.find(_B64_CALL)
    while start >= 0:
        end = cells.find('"', start + len(_B64_CALL))
        if end < 0:
            break
        try:
            _add(table, base64.b64decode(cells[start + len(_B64_CALL):end].encode()).decode(), ast)
        except Exception:  # noqa: BLE001 - not decodable or not compilable: the child does it for real
            pass
        start = cells.find(_B64_CALL, end)
    return table


def _add(table: dict, text: str, ast) -> None:
    tree = ast.parse(text)
    table[("parse", text)] = tree
    if tree.body and isinstance(tree.body[-1], ast.Expr):  # the release's split: body lines, last lines
        node, lines = tree.body[-1], text.splitlines()
        end = getattr(node, "end_lineno", None) or node.lineno
        body, last = "\n".join(lines[:node.lineno - 1]), "\n".join(lines[node.lineno - 1:end])
        if body:
            table[("exec", body)] = compile(body, "<string>", "exec")
        if last:
            table[("eval", last)] = compile(last, "<string>", "eval")
    else:
        table[("exec", text)] = compile(text, "<string>", "exec")
