"""Shared fixtures for the RL tests."""
from __future__ import annotations

import pytest

from rl_synthetic import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3")
    build_tiny_model().save_pretrained(path)
    return path
