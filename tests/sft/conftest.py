"""Fixtures for the SFT tests: a jsonl file of 8 small conversations in our messages format."""
from __future__ import annotations

from pathlib import Path

import pytest
from sft_rows import eight_rows, write_jsonl


@pytest.fixture
def sft_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "sft.jsonl", eight_rows())


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny model trains faster on one thread, and far faster when other tests share the cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
