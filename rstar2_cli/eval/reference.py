"""The reference graders, imported from the packages that define them (`rstar2[eval-extra]`).

GPQA's answer extraction and IFEval's instruction checkers come from lm-eval, BFCL's AST checker
from bfcl-eval: a number computed here is the reference's own. Both packages install with
`--no-deps` (their full dependency sets would pin numpy and pandas below ours, see
scripts/install.sh), so only the checker modules are imported, never the harnesses:

- `lm_eval.tasks` and `lm_eval.filters` build the whole task and filter registries on import
  (sacrebleu, evaluate, scikit-learn...). The checker modules below them need only nltk,
  langdetect and immutabledict, so those two packages are registered as plain namespaces over
  their installed folders and the checker modules are imported from there, unchanged.
- `bfcl_eval.constants.model_config` imports every vendor SDK BFCL supports (anthropic, cohere,
  google-genai...). The AST checker reads one field from it, `underscore_to_dot` of the model
  being scored, to undo a '.'-to-'_' rename that only OpenAI-style APIs need. Our model writes
  Hermes `<tool_call>`s with the names as given, which BFCL's own table records for the Hermes
  handler it ships (`Qwen/Qwen3-8B-FC`: underscore_to_dot=False); that one entry is what the
  checker sees.
- bfcl-eval's Qwen/Hermes handler (`model_handler/local_inference/qwen_fc.py`, QwenFCHandler)
  and lm-eval's `exact_match` (`api/metrics.py`) sit in modules that import what the extra does
  not install (the handlers' OpenAI client and tree-sitter parsers; sacrebleu). The few
  definitions used here (`QwenFCHandler.decode_ast` and `_extract_tool_calls`,
  `exact_match_hf_evaluate`) are compiled from those installed files, unchanged
  (`definitions_from_source`), so the parsing and matching are the packages' own code.
- IFEval's sentence and capital-word counts call nltk's punkt_tab tokenizer, which nltk fetches
  at run time. The extra installs it from PyPI instead: llama-index-core ships nltk_data's
  punkt_tab in its wheel (`llama_index/core/_static/nltk_cache`); that folder is put first on
  nltk's data path (llama_index itself is never imported).
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import importlib.util
import sys
import types
from functools import lru_cache
from pathlib import Path
from typing import Any

EXTRA = "eval-extra"
# --no-deps: a plain `pip install 'rstar2[eval-extra]'` would resolve bfcl-eval's numpy==1.26.4 pin
EXTRA_HINT = (
    f"install rstar2[{EXTRA}] with `pip install --no-deps -r requirements/eval-extra.txt` (as scripts/install.sh does)"
)
# The exact versions pyproject's eval-extra pins; the reference tests compare against these.
LM_EVAL_VERSION = "0.4.13"
BFCL_EVAL_VERSION = "2026.3.23"
# The BFCL model entry whose checker settings apply to Hermes-format output (bfcl_eval's
# constants/model_config.py: QwenFCHandler, underscore_to_dot=False).
BFCL_MODEL_NAME = "Qwen/Qwen3-8B-FC"


class MissingExtraError(ImportError):
    """A reference grader's package is not installed; the message names the extra."""


def _require(dist: str, what: str) -> None:
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        raise MissingExtraError(f"{what} needs the {dist} package: {EXTRA_HINT}") from None


def _namespace(package: str) -> None:
    """Register `package` (e.g. lm_eval.tasks) as a bare package over its installed folder, so its
    submodules import without running its __init__ (which builds lm-eval's whole registry)."""
    if package in sys.modules:
        return
    parent, _, child = package.rpartition(".")
    spec = importlib.util.find_spec(parent)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(f"{parent} is not installed: {EXTRA_HINT}")
    folder = Path(list(spec.submodule_search_locations)[0]) / child
    module = types.ModuleType(package)
    module.__path__ = [str(folder)]
    module.__package__ = package
    sys.modules[package] = module


def punkt_tab_dir() -> Path | None:
    """The nltk_data folder holding tokenizers/punkt_tab, as llama-index-core ships it (None if absent)."""
    try:
        root = Path(str(md.distribution("llama-index-core").locate_file("llama_index/core/_static/nltk_cache")))
    except md.PackageNotFoundError:
        return None
    return root if (root / "tokenizers" / "punkt_tab" / "english").is_dir() else None


def _nltk_data() -> None:
    import nltk

    found = punkt_tab_dir()
    if found is None:
        # lm-eval's instructions_util would otherwise call nltk.download() at import
        raise MissingExtraError(f"IFEval needs nltk's punkt_tab (from llama-index-core): {EXTRA_HINT}")
    if str(found) not in nltk.data.path:
        nltk.data.path.insert(0, str(found))


@lru_cache(maxsize=1)
def ifeval() -> types.ModuleType:
    """lm-eval's `tasks/ifeval/utils.py` (process_results, agg_inst_level_acc, InputExample...)."""
    for dist in ("lm_eval", "nltk", "langdetect", "immutabledict", "llama-index-core"):
        _require(dist, "IFEval grading")
    _nltk_data()
    import langdetect

    # langdetect samples n-grams at random: unseeded, the language checks of one response can
    # flip between runs. Seeded, each detect() call is a pure function of its text.
    langdetect.DetectorFactory.seed = 0
    _namespace("lm_eval.tasks")
    return importlib.import_module("lm_eval.tasks.ifeval.utils")


@lru_cache(maxsize=1)
def multi_choice_filter_class() -> Any:
    """lm-eval's MultiChoiceRegexFilter: the answer extraction of its GPQA tasks ("flexible-extract")."""
    _require("lm_eval", "GPQA grading")
    _namespace("lm_eval.filters")
    return importlib.import_module("lm_eval.filters.extraction").MultiChoiceRegexFilter


@lru_cache(maxsize=1)
def gpqa_preprocess() -> Any:
    """lm-eval's GPQA choice cleaning (`tasks/gpqa/cot_zeroshot/utils.preprocess`)."""
    _require("lm_eval", "GPQA prompts")
    _namespace("lm_eval.tasks")
    return importlib.import_module("lm_eval.tasks.gpqa.cot_zeroshot.utils").preprocess


@lru_cache(maxsize=1)
def bfcl_ast_checker() -> types.ModuleType:
    """bfcl-eval's `eval_checker/ast_eval/ast_checker.py` (ast_checker and its helpers)."""
    _require("bfcl_eval", "BFCL grading")
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class CheckerModelConfig:       # the one ModelConfig field ast_checker reads
            underscore_to_dot: bool

        shim = types.ModuleType(name)
        shim.MODEL_CONFIG_MAPPING = {BFCL_MODEL_NAME: CheckerModelConfig(underscore_to_dot=False)}
        sys.modules[name] = shim
    return importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")


def _package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(f"{package} is not installed: {EXTRA_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / relative


def definitions_from_source(path: Path, names: dict[str, tuple[str, ...]], namespace: dict[str, Any]) -> dict[str, Any]:
    """Compile, from the installed file `path`, the top-level functions and classes named in
    `names` (a class keeps only the methods listed with it, and no base classes or `override`
    decorators), in `namespace` (the globals they use), and return them by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    keep = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            keep.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in names:
            node.body = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name in names[node.name]]
            for m in node.body:
                m.decorator_list = [d for d in m.decorator_list if not (isinstance(d, ast.Name) and d.id == "override")]
            node.bases, node.keywords, node.decorator_list = [], [], []
            keep.append(node)
    found = {n.name for n in keep}
    if found != set(names):
        raise MissingExtraError(f"{path}: no {sorted(set(names) - found)[0]} in the installed file: {EXTRA_HINT}")
    scope = dict(namespace)
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), scope)
    return {name: scope[name] for name in names}


@lru_cache(maxsize=1)
def bfcl_qwen_decoder() -> Any:
    """An object whose `decode_ast(result, language, has_tool_call_tag)` is bfcl-eval's
    QwenFCHandler.decode_ast (the `<tool_call>\\n...\\n</tool_call>` parsing of its Hermes handler)."""
    _require("bfcl_eval", "BFCL grading")
    import json
    import re

    path = _package_file("bfcl_eval", "model_handler/local_inference/qwen_fc.py")
    cls = definitions_from_source(path, {"QwenFCHandler": ("decode_ast", "_extract_tool_calls")},
                                  {"json": json, "re": re, "Any": Any})["QwenFCHandler"]
    return cls()


@lru_cache(maxsize=1)
def lm_eval_exact_match() -> Any:
    """lm-eval's `exact_match_hf_evaluate(predictions, references, ignore_case, ignore_punctuation, ...)`."""
    _require("lm_eval", "GPQA grading")
    import re
    import string

    import numpy as np

    path = _package_file("lm_eval", "api/metrics.py")
    return definitions_from_source(path, {"exact_match_hf_evaluate": ()},
                                   {"np": np, "re": re, "string": string})["exact_match_hf_evaluate"]


@lru_cache(maxsize=1)
def bfcl_entry_checkers() -> dict[str, Any]:
    """bfcl-eval's per-entry scoring (`eval_checker/eval_runner.py`): `_evaluate_single_ast_entry`
    (decode, format check, ast_checker) and `_evaluate_single_relevance_entry` (irrelevance: no
    decodable call), compiled over the installed checker and utils."""
    checker, utils = bfcl_ast_checker(), bfcl_utils()
    from bfcl_eval.constants.enums import Language, ReturnFormat

    path = _package_file("bfcl_eval", "eval_checker/eval_runner.py")
    names = {"_evaluate_single_ast_entry": (), "_evaluate_single_relevance_entry": ()}
    scope = {
        "ast_checker": checker.ast_checker,
        "is_function_calling_format_output": utils.is_function_calling_format_output,
        "is_empty_output": utils.is_empty_output,
        "Language": Language,
        "ReturnFormat": ReturnFormat,
        "Any": Any,
    }
    found = definitions_from_source(path, names, scope)
    return {"ast": found["_evaluate_single_ast_entry"], "relevance": found["_evaluate_single_relevance_entry"]}


@lru_cache(maxsize=1)
def bfcl_utils() -> types.ModuleType:
    """bfcl-eval's `utils` (load_dataset_entry with its language hints, load_ground_truth_entry,
    is_empty_output, is_function_calling_format_output)."""
    bfcl_ast_checker()          # installs the model_config shim its imports need
    return importlib.import_module("bfcl_eval.utils")


@lru_cache(maxsize=1)
def bfcl_summary() -> types.ModuleType:
    """bfcl-eval's `eval_checker/eval_runner_helper` (calculate_unweighted_accuracy: its summary formula)."""
    bfcl_ast_checker()
    return importlib.import_module("bfcl_eval.eval_checker.eval_runner_helper")


def bfcl_data_dir() -> Path:
    """bfcl-eval's bundled data folder (questions, and possible_answer/ with the ground truth)."""
    _require("bfcl_eval", "BFCL data")
    spec = importlib.util.find_spec("bfcl_eval")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def versions() -> dict[str, str | None]:
    """Installed versions of the reference packages, recorded in every results.json."""
    out: dict[str, str | None] = {}
    for dist in ("lm_eval", "bfcl_eval", "nltk", "langdetect", "llama-index-core"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out
