"""The eval package's imports run one way: the families (gpqa, ifeval, bfcl) import only the
shared eval/family.py and the reference wrapper, the registry (benchmarks.py) imports the
families, and no module of the package reaches back to one that imports it. Imports inside
functions count too; no private name crosses modules."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rstar2_cli" / "eval"
MODULES = {f"rstar2_cli.eval.{p.stem}": p for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}
FAMILIES = ("rstar2_cli.eval.gpqa", "rstar2_cli.eval.ifeval", "rstar2_cli.eval.bfcl")


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            out += [(s, []) for s in subs] or [(node.module, [a.name for a in node.names])]
    return out


GRAPH = {m: {i for i, _ in _imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def test_no_import_cycle_in_eval():
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in GRAPH[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    cycles = sorted(m for m in MODULES if m in reach(m))
    assert not cycles, f"import cycles through {cycles}"


def test_families_import_the_shared_module_not_the_registry():
    allowed = {"rstar2_cli.eval.family", "rstar2_cli.eval.reference"}
    for fam in FAMILIES:
        assert GRAPH[fam] <= allowed, (fam, GRAPH[fam] - allowed)
        assert "rstar2_cli.eval.family" in GRAPH[fam]
    assert set(FAMILIES) <= GRAPH["rstar2_cli.eval.benchmarks"]


def test_no_private_name_crosses_eval_modules():
    for m, p in MODULES.items():
        for mod, names in _imports(p):
            if mod.startswith("rstar2_cli."):
                assert not [n for n in names if n.startswith("_")], (m, mod, names)
