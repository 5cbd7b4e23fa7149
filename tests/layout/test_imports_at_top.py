"""A module's dependencies are at its top. An import inside a function (any depth: a method, a nested
function) is allowed only with a reason written next to it, as a `# lazy: <why>` comment on the
import's first line or on the line directly above. This holds for:
- every import of a project module (`rstar2_cli.*`, `sandbox.*`, a relative import, and in
  `benchmarks/` a sibling script imported by file name) in `rstar2_cli/`, `sandbox/` and `benchmarks/`;
- every import of a heavy third-party package (`HEAVY`) in `rstar2_cli/` and `sandbox/`: such an
  import is often lazy on purpose (`rstar2 --help` must not load torch), and the comment says so.
vLLM in particular is imported only inside functions (or under `if TYPE_CHECKING:`) anywhere in
`rstar2_cli/` and `sandbox/`, so that `--help`, `prepare` and `sandbox` start without it and the
GPU proof image (benchmarks/gpu/gpu_image.py), which has no vLLM, can import the trainer's modules.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREES = ("rstar2_cli", "sandbox", "benchmarks")
CORE = ("rstar2_cli", "sandbox")
HEAVY = frozenset({"torch", "transformers", "vllm", "trl", "peft", "datasets"})
REASON = re.compile(r"#\s*lazy:\s*\S")
# being restructured: emptied before the issue closes
PENDING: frozenset[str] = frozenset()
# benchmarks/<folder>/<file>.py is imported by its file name (the folders are on sys.path)
BENCH_SCRIPTS = frozenset(p.stem for p in (REPO / "benchmarks").rglob("*.py")) | {"sim"}


def pending(relative: str) -> bool:
    return any(relative == p or (p.endswith("/") and relative.startswith(p)) for p in PENDING)


def function_imports(tree: ast.AST) -> list[tuple[ast.stmt, list[str]]]:
    """(import statement, top-level names it imports; "." for a relative one) for every import
    inside a function or lambda, at any depth."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if in_function and isinstance(node, ast.Import):
            found.append((node, [alias.name.split(".")[0] for alias in node.names]))
        elif in_function and isinstance(node, ast.ImportFrom):
            found.append((node, ["." if node.level else (node.module or "").split(".")[0]]))
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def module_level_imports(tree: ast.Module) -> list[tuple[ast.stmt, list[str]]]:
    """Imports that run when the module is imported: outside functions and outside `if TYPE_CHECKING:`."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.append((node, [alias.name.split(".")[0] for alias in node.names]))
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node, [(node.module or "").split(".")[0]]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def needs_reason(tree_name: str, top: str) -> bool:
    if top in (".", "rstar2_cli", "sandbox"):
        return True
    if tree_name == "benchmarks":
        return top in BENCH_SCRIPTS
    return top in HEAVY


def has_reason(lines: list[str], lineno: int) -> bool:
    """A `# lazy: ...` comment on the statement's first line or on the line directly above."""
    here = lines[lineno - 1]
    above = lines[lineno - 2].strip() if lineno >= 2 else ""
    return bool(REASON.search(here)) or (above.startswith("#") and bool(REASON.search(above)))


def sources(trees: tuple[str, ...]) -> list[tuple[str, Path]]:
    return [(str(p.relative_to(REPO)), p) for tree in trees for p in sorted((REPO / tree).rglob("*.py"))]


def unexplained(relative: str, text: str) -> list[str]:
    """`file:line: import ...` for each function-level import that needs a `# lazy:` reason and has none."""
    lines = text.splitlines()
    tree_name = relative.split("/")[0]
    out = []
    for node, tops in function_imports(ast.parse(text)):
        if any(needs_reason(tree_name, top) for top in tops) and not has_reason(lines, node.lineno):
            out.append(f"{relative}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def test_imports_inside_functions_say_why():
    offenders = [line for relative, path in sources(TREES) if not pending(relative)
                 for line in unexplained(relative, path.read_text())]
    assert not offenders, (
        f"{len(offenders)} imports inside functions without a `# lazy: <why>` comment (move them to the "
        "module's top, or say why they stay):\n" + "\n".join(offenders))


def test_vllm_is_never_imported_when_a_module_loads():
    eager = [f"{relative}:{node.lineno}" for relative, path in sources(CORE)
             for node, tops in module_level_imports(ast.parse(path.read_text())) if "vllm" in tops]
    assert not eager, f"vLLM imported at module level (import it inside the function that needs it): {eager}"


def test_the_scan_sees_each_form(tmp_path):
    """The detector on a file written for it: nested functions, methods, relative and heavy imports,
    a reason on the line or above, a multi-line import, a comment that is not a reason."""
    text = (
        "import torch\n"                                                   # 1 module level: fine
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import vllm\n"                                                # 4 type checking only: fine
        "def f():\n"
        "    import json\n"                                                # 6 light third party: fine
        "    from rstar2_cli.config import load\n"                         # 7 offender
        "    # lazy: torch; keeps rstar2 --help fast\n"
        "    import transformers\n"                                        # 9 reason above
        "    from . import sibling  # lazy: cycle with sibling\n"          # 10 reason on the line
        "    def g():\n"
        "        from sandbox.core import pool  # TODO\n"                  # 12 offender: not a reason
        "    return lambda: __import__('x')\n"
        "class C:\n"
        "    def m(self):\n"
        "        from vllm import (\n"                                     # 16 offender, multi-line
        "            LLM)  # lazy: too late, the comment is on the first line\n"
        "import vllm.config\n")                                            # 18 eager vLLM
    assert unexplained("rstar2_cli/probe.py", text) == [
        "rstar2_cli/probe.py:7: from rstar2_cli.config import load",
        "rstar2_cli/probe.py:12: from sandbox.core import pool  # TODO",
        "rstar2_cli/probe.py:16: from vllm import ("]
    eager = [node.lineno for node, tops in module_level_imports(ast.parse(text)) if "vllm" in tops]
    assert eager == [18]
    # in benchmarks/ a heavy third-party import is the script's business; a sibling script is the project's
    bench = "def main():\n    import torch\n    import smoke_model\n"
    assert unexplained("benchmarks/gpu/probe.py", bench) == ["benchmarks/gpu/probe.py:3: import smoke_model"]


def test_pending_names_files_that_exist():
    missing = sorted(p for p in PENDING if not (REPO / p).exists())
    assert not missing, f"PENDING names files that are gone (remove them from it): {missing}"
