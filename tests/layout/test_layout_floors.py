"""The rstar2_cli package's shape: modules import no cycle, no private name (`_x`) crosses modules,
and packages stand on floors that import only the floors below them. Imports inside functions
count too: a lazy import is still a dependency.

Why floors: a package that imports one above it drags the upper one's imports (vLLM, torch's
distributed stack, the eval families) into everything below, and lets a change at the top break a
leaf. The floors, bottom first, and what keeps them apart:
- the sandbox's base (`sandbox`, `inside`, `jail`, `core`): stands alone (tests/sandbox/test_sandbox_layout.py);
- leaves: `config`, `hosts` (ports, GPU visibility), `reward`, `data`, `protocol` (the tool text
  the model sees, which uses only `sandbox.core`'s result, never the HTTP service);
- `models` (the tiny model, the attention choice), the sandbox's service and Redis mode;
- `rollout` (engines, agent loop, weight sync, the tool sandbox);
- `launch` (plans engines, so above `rollout`), `eval`, `sft`;
- `rl`; then `quickstart` and `sandbox_bench`; then `commands`; then `cli`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOORS = (
    ("rstar2_cli", "sandbox", "sandbox.inside", "sandbox.jail", "sandbox.core"),
    ("config", "hosts", "reward", "data", "protocol"),
    ("models", "sandbox.service", "sandbox.redis_mode"),
    ("rollout",),
    ("launch", "eval", "sft"),
    ("rl",),
    ("quickstart", "sandbox_bench"),
    ("commands",),
    ("cli",),
)
FLOOR = {package: i for i, floor in enumerate(FLOORS) for package in floor}



def _modules(top: str) -> dict[str, Path]:
    found = {}
    for path in sorted((REPO / top).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


OURS = _modules("rstar2_cli")
KNOWN = {**OURS, **_modules("sandbox")}


def imports(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import in the file, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                target = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in KNOWN]
            out += [(sub, []) for sub in subs] or [(target, [a.name for a in node.names])]
    return out


def package(module: str) -> str:
    """The floor entry a module belongs to: `rstar2_cli.rl.trainer` -> `rl`, `sandbox.core.pool` ->
    `sandbox.core`, `rstar2_cli.cli` -> `cli`."""
    parts = module.split(".")
    if parts[0] == "sandbox":
        return ".".join(parts[:2])
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_floor():
    missing = sorted({package(m) for m in KNOWN} - set(FLOOR))
    assert not missing, f"packages with no floor in FLOORS: {missing}"


@pytest.mark.parametrize("module", sorted(OURS))
def test_imports_run_down_the_floors(module):
    mine = package(module)
    for target, _ in imports(module, OURS[module]):
        if target.split(".")[0] not in ("rstar2_cli", "sandbox") or package(target) == mine:
            continue
        theirs = package(target)
        assert FLOOR[theirs] < FLOOR[mine], (
            f"{module} imports {target}: {mine} (floor {FLOOR[mine]}) may import only the floors below it, "
            f"and {theirs} is on floor {FLOOR[theirs]}")


@pytest.mark.parametrize("module", sorted(OURS))
def test_no_private_name_crosses_modules(module):
    for target, names in imports(module, OURS[module]):
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not (target in KNOWN and target != module and private), (
            f"{module} takes private {private} from {target}: make it public where it is defined")


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_strongly_connected_finds_a_cycle_and_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [{"a", "b", "c"}]


def test_no_import_cycle():
    graph = {m: {t for t, _ in imports(m, p) if t in OURS and not m.startswith(t + ".")} for m, p in OURS.items()}
    cycles = [sorted(c) for c in strongly_connected(graph)]
    assert not cycles, f"import cycles: {cycles}"


def test_eval_families_import_the_shared_module_not_the_registry():
    """Inside eval/: the benchmark families import the shared eval/family.py (and the reference
    wrapper), never the registry that lists them; the registry imports the families."""
    eval_imports = {m: {t for t, _ in imports(m, OURS[m]) if t.startswith("rstar2_cli.eval.")}
                    for m in ("rstar2_cli.eval.gpqa", "rstar2_cli.eval.ifeval", "rstar2_cli.eval.bfcl",
                              "rstar2_cli.eval.benchmarks")}
    registry = eval_imports.pop("rstar2_cli.eval.benchmarks")
    for family, targets in eval_imports.items():
        assert "rstar2_cli.eval.family" in targets
        assert targets <= {"rstar2_cli.eval.family", "rstar2_cli.eval.reference"}, (family, targets)
    assert set(eval_imports) <= registry
