#!/usr/bin/env python3
"""Check that every vLLM and torch.distributed API the GPU path calls exists, with the parameters
the code passes. Exit 0 when all do, else 1 with one line per problem.

Why: nothing on the GPU path has run; an image whose vLLM lacks `WeightTransferTrainerFactory`,
or whose `AsyncEngineArgs` has no `weight_transfer_config`, must fail when it is built, not an
hour into a 64-GPU job. Dockerfile.rocm runs this after installing the project, and
tests/launch runs it on CPU against the installed vLLM.

What is checked, found two ways:
  * by reading the source (rstar2_cli/ by default): every `from vllm... import` and
    `from torch.distributed... import` / `import torch.distributed as ...` name, every call of
    such a name or of an attribute of it (`dist.all_reduce(...)`, `AsyncLLM.from_engine_args(...)`)
    with the number of positional arguments and the keyword names it passes;
  * `INSTANCE_CALLS` below: methods called on objects the reader cannot type (the vLLM `AsyncLLM`
    behind `self._llm` and `EngineSyncClient._all("...")`, vLLM's trainer-side transfer engines,
    DTensor), written down with the arguments the code passes.
Each name must import; each call must bind to `inspect.signature` (pybind functions: the first
signature of their docstring); a parameter list with **kwargs accepts any keyword.

    python benchmarks/gpu/check_gpu_apis.py [SOURCE_DIR ...]
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import rstar2_cli

ROOTS = ("vllm", "torch.distributed")


@dataclass(frozen=True)
class Use:
    """One API and one way it is called: `npos` positional arguments (None: not called, only
    referenced) and these keyword names."""

    target: str                                   # dotted name: module path, then attributes
    npos: int | None = None
    keywords: frozenset[str] = field(default_factory=frozenset)
    where: str = ""


def _use(target: str, npos: int | None = None, *keywords: str, where: str = "") -> Use:
    return Use(target, npos, frozenset(keywords), where)


ASYNC_LLM = "vllm.v1.engine.async_llm.AsyncLLM"
TRAINER_ENGINE = "vllm.distributed.weight_transfer.base.TrainerWeightTransferEngine"
# Method calls on objects whose type the source reader cannot know, as rstar2_cli makes them
# (rollout/engines.py: self._llm is an AsyncLLM; rollout/weight_sync/client.py: EngineSyncClient._all
# and the senders WeightTransferTrainerFactory.trainer_init returns).
INSTANCE_CALLS: tuple[Use, ...] = (
    _use(f"{ASYNC_LLM}.generate", 2, "request_id", "priority"),
    _use(f"{ASYNC_LLM}.pause_generation", 0, "mode", "clear_cache"),
    _use(f"{ASYNC_LLM}.resume_generation", 0),
    _use(f"{ASYNC_LLM}.update_weight_version", 1),     # partial rollouts' per-token version label
    _use(f"{ASYNC_LLM}.collective_rpc", 1, "args"),
    _use(f"{ASYNC_LLM}.reset_prefix_cache", 0),
    _use(f"{ASYNC_LLM}.sleep", 0, "level"),
    _use(f"{ASYNC_LLM}.wake_up", 1),
    _use(f"{ASYNC_LLM}.init_weight_transfer_engine", 1),
    _use(f"{ASYNC_LLM}.start_weight_update", 0),
    _use(f"{ASYNC_LLM}.update_weights", 1),
    _use(f"{ASYNC_LLM}.finish_weight_update", 1),
    _use("vllm.v1.metrics.loggers.StatLoggerBase.record", 0, "scheduler_stats", "iteration_stats",
         "mm_cache_stats", "engine_idx"),
    _use("vllm.v1.metrics.loggers.StatLoggerBase.log_engine_initialized", 0),
    # weight_sync/ipc.py and nccl.py: `trainer_factory` is vLLM's factory, passed in (tests pass a fake)
    _use("vllm.distributed.weight_transfer.WeightTransferTrainerFactory.trainer_init", 1, "client", "source"),
    _use(f"{TRAINER_ENGINE}.send_weights", 0),
    _use(f"{TRAINER_ENGINE}.shutdown", 0),
    # the **sizing of rollout/engines.py (launch/engine_sizing.py `engine_kwargs`)
    _use("vllm.engine.arg_utils.AsyncEngineArgs", 0, "enable_chunked_prefill", "max_num_batched_tokens",
         "enforce_eager", "max_num_seqs", "gpu_memory_utilization"),
    # the V1 runner pin of colocated engines (rollout/engine_env.py): the variable vLLM reads
    _use("vllm.envs.VLLM_USE_V2_MODEL_RUNNER"),
    _use("vllm.config.vllm.VllmConfig.use_v2_model_runner"),
    _use("torch.distributed.tensor.DTensor.full_tensor", 0),
    _use("torch.distributed.tensor.DTensor.to_local", 0),
)


# ---------------------------------------------------------------- reading the source


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _watched(module: str) -> bool:
    return any(module == r or module.startswith(r + ".") for r in ROOTS)


def uses_in_source(path: Path) -> list[Use]:
    """The watched APIs one file imports and calls."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: dict[str, str] = {}          # local name -> dotted target
    uses: list[Use] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and _watched(node.module):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                names[alias.asname or alias.name] = target
                uses.append(Use(target, where=f"{path}:{node.lineno}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _watched(alias.name) and alias.asname:
                    names[alias.asname] = alias.name
    def target_of(expr: ast.AST) -> str | None:
        dotted = _dotted(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in names:
            return names[head] + (f".{rest}" if rest else "")
        return dotted if dotted.startswith("torch.distributed.") else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (target := target_of(node)):
            uses.append(Use(target, where=f"{path}:{node.lineno}"))      # e.g. RequestOutputKind.FINAL_ONLY
        if not isinstance(node, ast.Call) or not (target := target_of(node.func)):
            continue
        # *args and **kwargs are not counted: the explicit arguments must still bind
        npos = sum(not isinstance(a, ast.Starred) for a in node.args)
        uses.append(Use(target, npos, frozenset(k.arg for k in node.keywords if k.arg), f"{path}:{node.lineno}"))
    return uses


def source_uses(dirs: Iterable[Path]) -> list[Use]:
    return [u for d in dirs for f in sorted(Path(d).rglob("*.py")) for u in uses_in_source(f)]


# ---------------------------------------------------------------- checking


def resolve(target: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, attr in enumerate(parts[cut:], start=cut):
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                raise LookupError(f"{'.'.join(parts[:i])} has no attribute {attr!r}") from None
        return obj
    raise LookupError(f"cannot import {parts[0]}")


_DOC_SIGNATURE = re.compile(r"^\w+\((.*?)\)(?: ->|$)", re.M)


def _doc_parameters(obj) -> tuple[list[str], bool] | None:
    """(parameter names, takes **kwargs) from a pybind docstring's first signature."""
    doc = getattr(obj, "__doc__", None) or ""
    match = _DOC_SIGNATURE.search(doc)
    if not match:
        return None
    params = []
    for piece in re.split(r",\s*(?![^\[]*\])", match.group(1)):
        name = piece.split(":")[0].split("=")[0].strip()
        if name:
            params.append(name)
    return params, any(p.startswith("**") for p in params)


def check_use(use: Use) -> str | None:
    """None when `use` imports and binds, else a one-line problem."""
    try:
        obj = resolve(use.target)
    except LookupError as e:
        return f"{use.target}: {e}"
    if use.npos is None:
        return None
    npos = use.npos
    if inspect.isclass(obj) and hasattr(obj, "__total__") and hasattr(obj, "__annotations__"):   # a TypedDict
        missing = sorted(k for k in use.keywords if k not in obj.__annotations__)
        return f"{use.target}: no key {', '.join(missing)}" if missing or npos else None
    function = obj.__init__ if inspect.isclass(obj) and "(self:" in (obj.__init__.__doc__ or "") else obj
    try:
        sig = inspect.signature(function)
    except (TypeError, ValueError):
        parsed = _doc_parameters(function)
        if parsed is None:
            return f"{use.target}: no signature to check"
        params, var_kw = parsed
        params = [p for p in params if p != "self"]
        missing = sorted(k for k in use.keywords if k not in params)
        if missing and not var_kw:
            return f"{use.target}: no parameter {', '.join(missing)}"
        return None if npos <= len(params) else f"{use.target}: takes {len(params)} arguments, called with {npos}"
    owner = use.target.rsplit(".", 1)[0]
    if inspect.isfunction(obj) and inspect.isclass(_safe_resolve(owner)):
        npos += 1                        # an instance method looked up on its class: self
    try:
        sig.bind_partial(*([None] * npos), **{k: None for k in use.keywords})
    except TypeError as e:
        return f"{use.target}{sig}: {e}"
    return None


def _safe_resolve(target: str):
    try:
        return resolve(target)
    except LookupError:
        return None


def check(uses: Iterable[Use]) -> list[str]:
    """One line per problem, each distinct (target, problem) once, with where it is used."""
    problems: dict[str, str] = {}
    for use in uses:
        problem = check_use(use)
        if problem is not None and problem not in problems:
            problems[problem] = use.where
    return [f"{p}" + (f"  (used at {w})" if w else "") for p, w in problems.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="source folders to read (default: the installed rstar2_cli)")
    args = ap.parse_args(argv)
    if args.dirs:
        dirs = args.dirs
    else:
        dirs = [Path(rstar2_cli.__file__).parent]
    uses = source_uses(dirs) + list(INSTANCE_CALLS)
    problems = check(uses)
    import torch
    import vllm

    targets = {u.target for u in uses}
    print(f"torch {torch.__version__}, vllm {vllm.__version__}: {len(targets)} APIs, {len(uses)} uses checked")
    for line in problems:
        print(f"MISSING {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
