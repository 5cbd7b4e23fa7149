"""The input checks let good input through: a real checkpoint, a cached Hub model, a folder still
to be created, a local copy of an eval set, a reachable Hub, a free port (the refusals are in
test_bad_input.py, run as a user runs the commands)."""
from __future__ import annotations

import json
import socket

import pytest
import typer

from rstar2_cli.commands import checks


def refused(call, *args, **kwargs) -> bool:
    try:
        call(*args, **kwargs)
    except typer.Exit as e:
        assert e.exit_code == 2
        return True
    return False


def test_a_checkpoint_rstar2_writes_passes(tiny_model):
    assert not refused(checks.model_dir, str(tiny_model), "MODEL")
    assert not refused(checks.tokenizer_source, str(tiny_model), "--tokenizer")


def test_a_hub_model_in_the_local_cache_passes_and_one_outside_it_does_not(tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert not refused(checks.model_dir, "org/cached", "MODEL")
    assert refused(checks.model_dir, "org/other", "MODEL")


def test_outputs_still_to_be_created_pass(tmp_path):
    assert not refused(checks.output_dir, tmp_path / "a" / "b", "--out")
    assert not refused(checks.output_file, tmp_path / "a" / "out.jsonl", "--out")
    assert not (tmp_path / "a").exists()          # checking creates nothing


def test_a_named_set_with_a_local_copy_passes_without_the_hub(tmp_path, monkeypatch):
    (tmp_path / "aime24.jsonl").write_text('{"id": "1", "problem": "p", "answer": "1"}\n')
    monkeypatch.setattr(checks, "hub_reachable", lambda *a: pytest.fail("the Hub was probed"))
    assert not refused(checks.problem_source, "aime24", "benchmark", str(tmp_path))
    assert not refused(checks.problem_source, "aime24", "benchmark", str(tmp_path), allow_hub=False)


def test_eval_of_a_shipped_set_passes_with_no_data_folder_and_no_hub(tiny_model, tmp_path, monkeypatch):
    """`rstar2 eval aime25 CKPT` offline on a fresh install: the set ships with rstar2."""
    from rstar2_cli.eval.settings import EvalSettings

    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    monkeypatch.setattr(checks, "hub_reachable", lambda *a: pytest.fail("the Hub was probed"))
    for name in ("aime24", "aime25", "math500", "hmmt25"):
        settings = EvalSettings(benchmark=name, model=str(tiny_model), out_dir=str(tmp_path / name))
        assert not refused(checks.eval_settings, settings)
        assert checks.eval_data_missing(name, None) is None
        assert not refused(checks.problem_source, name, "train.eval_sets", None, allow_hub=False)
    assert refused(checks.problem_source, "dapo_math_17k", "data.train", None, allow_hub=False)   # not shipped


def test_the_hub_probe_sees_a_listening_endpoint_and_a_refusing_one(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as server, socket.socket() as closed:
        server.bind(("127.0.0.1", 0))
        server.listen()
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert checks.hub_reachable()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        assert not checks.hub_reachable()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")          # the datasets cache answers instead
        assert checks.hub_reachable()


def test_a_free_port_passes_and_a_taken_one_does_not():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert refused(checks.free_port, "127.0.0.1", port)
    assert not refused(checks.free_port, "127.0.0.1", port)
