"""The sandbox package's shape, as docs/sandbox.md states it: it stands alone (nothing from
rstar2_cli), each sub-package imports only those before it, modules import no cycle, and what
runs in the jail imports only the standard library (every module a zygote imports makes each
fork dearer). Imports inside functions count too."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sandbox"
ORDER = ("sandbox.inside", "sandbox.jail", "sandbox.core", "sandbox.service", "sandbox.redis_mode")
PRELOADED = {"sympy"}  # the zygote imports it only when asked to preload it, to warm its caches


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import statement in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            out += [(sub, []) for sub in subs] or [(node.module, [a.name for a in node.names])]
    return out


def _layer(module: str) -> int:
    return next(i for i, pkg in enumerate(ORDER) if module == pkg or module.startswith(pkg + "."))


@pytest.mark.parametrize("module", [m for m in MODULES if m != "sandbox"])
def test_imports_stay_in_their_layer(module):
    for target, names in _imports(MODULES[module]):
        assert not target.startswith("rstar2_cli"), f"{module} imports {target}: the sandbox stands alone"
        if target.startswith("sandbox."):
            assert _layer(target) <= _layer(module), f"{module} imports {target}, a later sub-package"
            assert not [n for n in names if n.startswith("_")], f"{module} takes private {names} from {target}"
        elif module.startswith("sandbox.inside") and target != "sandbox":
            top = target.split(".")[0]
            assert top in sys.stdlib_module_names or top in PRELOADED, f"{module} (runs in the jail) imports {target}"


def test_no_import_cycle():
    graph = {m: {t for t, _ in _imports(p) if t in MODULES and not m.startswith(t + ".")} for m, p in MODULES.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join(path[path.index(module):] + (module,))}"
        if module not in done:
            for target in graph[module]:
                visit(target, path + (module,))
            done.add(module)

    for module in graph:
        visit(module, ())
