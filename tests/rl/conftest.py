"""Shared fixtures for the RL tests."""
from __future__ import annotations

import socket

import pytest

from rl_synthetic import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3")
    build_tiny_model().save_pretrained(path)
    return path


@pytest.fixture
def free_port() -> int:
    """A TCP port nothing listens on, for a torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
