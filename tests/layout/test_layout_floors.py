"""The project's shape: modules import no cycle, no private name (`_x`) crosses modules, and
packages stand on floors that import only the floors below them. Imports inside functions count
too (a lazy import is still a dependency), and so do `importlib.import_module("...")` calls and a
private name taken by attribute access (`module._x`, where `module` is a project module imported
under any name). Three trees are scanned: `rstar2_cli/`, `sandbox/` and `benchmarks/`.

Why floors: a package that imports one above it drags the upper one's imports (vLLM, torch's
distributed stack, the eval families) into everything below, and lets a change at the top break a
leaf. The floors, bottom first, and what keeps them apart:
- the sandbox's base (`sandbox`, `inside`, `jail`, `core`): stands alone (tests/sandbox/test_sandbox_layout.py);
- leaves: `config`, `hosts` (ports, GPU visibility), `reward`, `data`, `protocol` (the tool text
  the model sees, which uses only `sandbox.core`'s result, never the HTTP service);
- `models` (the tiny model, the attention choice), `inspector` (reads run and eval files and writes the
  trajectory page: files and `protocol`'s tags only, never `rollout` or `rl`), the sandbox's service
  and Redis mode;
- `rollout` (engines, agent loop, weight sync, the tool sandbox);
- `launch` (plans engines, so above `rollout`), `eval`, `sft`;
- `rl`, grouped by job, bottom first: `rl.measures` (a step's timer and tallies), `rl.ranks`
  (processes, hosts, the exchange), `rl.update`, `rl.selection` (exclusion, RoC, advantages),
  `rl.logs`, `rl.run` (the trainer, batch sources, resume, faults, the launch entry);
- then `quickstart`, `sandbox_bench` and `prepare` (`rstar2 prepare`'s jobs that roll out a
  policy: eval's runner on launch's engines, with a run's recipe); then `commands`; then `cli`.
`benchmarks/` stands on all of them: it may import `rstar2_cli` and `sandbox`, and its scripts
import each other by file name (`import smoke_model`, `from sim.workload import ...`: the folders
are on sys.path, pyproject.toml's pytest `pythonpath`), never a private name; `rstar2_cli` and
`sandbox` never import `benchmarks`, and `sandbox` never imports `rstar2_cli`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOORS = (
    ("rstar2_cli", "recipe_text", "source_commit", "sandbox", "sandbox.inside", "sandbox.jail", "sandbox.core"),
    ("config", "hosts", "reward", "data", "protocol"),
    ("models", "inspector", "sandbox.service", "sandbox.redis_mode"),
    ("rollout",),
    ("launch", "eval", "sft"),
    ("rl", "rl.measures"),
    ("rl.ranks",),
    ("rl.update",),
    ("rl.selection",),
    ("rl.logs",),
    ("rl.run",),
    ("quickstart", "sandbox_bench", "prepare"),
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
SANDBOX = _modules("sandbox")
BENCH = _modules("benchmarks")
KNOWN = {**OURS, **SANDBOX, **BENCH}
# benchmarks/<folder>/<file>.py is imported as `<file>` (the folder is on sys.path) or `<folder>.<file>`
# (benchmarks/ is); sim/ is a package
BENCH_NAMES = {alias: m for m in BENCH for alias in (m.split(".", 1)[1], m.split(".")[-1]) if m.count(".") == 2}
BENCH_NAMES.update({m.split(".", 1)[1]: m for m in BENCH if m.count(".") == 1})


def canonical(name: str) -> str:
    """An imported module's name as KNOWN spells it (benchmarks' short names resolved)."""
    return BENCH_NAMES.get(name, name)


def _importlib_target(node: ast.AST) -> str | None:
    """The module an `importlib.import_module(...)` / `import_module(...)` call names: its string,
    or an f-string's constant head (`f"rstar2_cli.commands.{name}"` -> `rstar2_cli.commands`)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    fn = node.func
    if not ((isinstance(fn, ast.Attribute) and fn.attr == "import_module") or
            (isinstance(fn, ast.Name) and fn.id == "import_module")):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".") or None
    return None


def imports(module: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import in the file, relative ones resolved,
    `importlib.import_module` calls included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(canonical(alias.name), []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (path.name == "__init__.py")]
                target = ".".join(base + ([node.module] if node.module else []))
            target = canonical(target)
            subs = [canonical(f"{target}.{a.name}") for a in node.names if canonical(f"{target}.{a.name}") in KNOWN]
            out += [(sub, []) for sub in subs] or [(target, [a.name for a in node.names])]
        elif (target := _importlib_target(node)) is not None:
            out.append((canonical(target), []))
    return out


def _bound_modules(tree: ast.AST) -> dict[str, str]:
    """Local name -> project module it is bound to: `import a.b as m`, `from a import b` (a module),
    `m = importlib.import_module("a.b")`."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and canonical(alias.name) in KNOWN:
                    bound[alias.asname] = canonical(alias.name)
                elif not alias.asname and canonical(alias.name) in KNOWN and "." not in alias.name:
                    bound[alias.name] = canonical(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = canonical(f"{canonical(node.module)}.{alias.name}")
                if full in KNOWN:
                    bound[alias.asname or alias.name] = full
        elif isinstance(node, ast.Assign) and (target := _importlib_target(node.value)) is not None:
            for name in node.targets:
                if isinstance(name, ast.Name) and canonical(target) in KNOWN:
                    bound[name.id] = canonical(target)
    return bound


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


def private_attributes(module: str, path: Path) -> list[tuple[str, str]]:
    """(project module, private name) for every `module._name` the file reads, the module imported
    under any name (`import a.b as m; m._x`, `a.b._x` after `import a.b`, `from a import b; b._x`)."""
    tree = ast.parse(path.read_text())
    bound = _bound_modules(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = _dotted(node.value)
        if owner is None:
            continue
        head, _, rest = owner.partition(".")
        target = ".".join(filter(None, (bound.get(head, head), rest)))
        if target in KNOWN and target != module and (head in bound or "." in owner):
            out.append((target, node.attr))
    return out


def package(module: str) -> str:
    """The floor entry a module belongs to: `rstar2_cli.rl.run.trainer` -> `rl`, `sandbox.core.pool` ->
    `sandbox.core`, `rstar2_cli.cli` -> `cli`."""
    parts = module.split(".")
    if parts[0] == "sandbox":
        return ".".join(parts[:2])
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_package_has_a_floor():
    missing = sorted({package(m) for m in {**OURS, **SANDBOX}} - set(FLOOR))
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


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_no_private_name_crosses_modules(module):
    for target, names in imports(module, KNOWN[module]):
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not (target in KNOWN and target != module and private), (
            f"{module} takes private {private} from {target}: make it public where it is defined")
    taken = private_attributes(module, KNOWN[module])
    assert not taken, (f"{module} reads private {[f'{t}.{n}' for t, n in taken]}: make it public where it is "
                       f"defined")


@pytest.mark.parametrize("module", sorted({**OURS, **SANDBOX}))
def test_the_runtime_never_imports_benchmarks_and_the_sandbox_never_the_core(module):
    for target, _ in imports(module, KNOWN[module]):
        assert not (target == "benchmarks" or target.startswith("benchmarks.")), f"{module} imports {target}"
        if module.split(".")[0] == "sandbox":
            assert target.split(".")[0] != "rstar2_cli", f"{module} imports {target}: the sandbox stands alone"


def test_benchmark_file_names_are_unique():
    """A benchmark is imported by its file name alone, so two folders may not share one."""
    stems = [m.split(".")[-1] for m in BENCH if m.count(".") == 2]
    assert len(stems) == len(set(stems)), sorted(s for s in stems if stems.count(s) > 1)


def test_the_scans_see_attribute_access_and_importlib(tmp_path):
    """The detectors on a file written for them: each form of import and of private access."""
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "import rstar2_cli.rollout.agent_loop\n"
        "import rstar2_cli.reward.grader as grader\n"
        "from rstar2_cli.protocol import parser\n"
        "import smoke_model as sm\n"
        "loop = importlib.import_module('rstar2_cli.rollout.scheduler')\n"
        "def f(name):\n"
        "    importlib.import_module(f'rstar2_cli.commands.{name}')\n"
        "    return (rstar2_cli.rollout.agent_loop._LoopSetup, grader._check_timeout, parser._TAG, sm._private,\n"
        "            loop._Dispatcher, parser.__doc__, grader.GraderPool, source._x)\n")
    found = imports("benchmarks.timing.probe", source)
    assert ("rstar2_cli.rollout.scheduler", []) in found and ("rstar2_cli.commands", []) in found
    assert ("benchmarks.gpu.smoke_model", []) in found and ("rstar2_cli.protocol.parser", []) in found
    assert sorted(private_attributes("benchmarks.timing.probe", source)) == sorted([
        ("benchmarks.gpu.smoke_model", "_private"), ("rstar2_cli.reward.grader", "_check_timeout"),
        ("rstar2_cli.rollout.agent_loop", "_LoopSetup"), ("rstar2_cli.protocol.parser", "_TAG"),
        ("rstar2_cli.rollout.scheduler", "_Dispatcher")])


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
    graph = {m: {t for t, _ in imports(m, p) if t in KNOWN and not m.startswith(t + ".")} for m, p in KNOWN.items()}
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
