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
- IFEval's sentence and capital-word counts call nltk's punkt_tab tokenizer, which nltk fetches
  at run time. The extra installs it from PyPI instead: llama-index-core ships nltk_data's
  punkt_tab in its wheel (`llama_index/core/_static/nltk_cache`); that folder is put first on
  nltk's data path (llama_index itself is never imported).
"""
from __future__ import annotations

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
EXTRA_HINT = f"install rstar2[{EXTRA}] with `pip install --no-deps -r requirements/eval-extra.txt` (as scripts/install.sh does)"
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
