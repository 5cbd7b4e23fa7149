"""`rstar2 rl --gpus 0` with a paper stage: the plan says in one line that it trains on this
machine's CPU and what the model's fp32 state takes there, and a model whose state cannot fit the
host's memory is refused (exit 2, one line) instead of running out of memory after loading."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.launch import memory_plan as mp
from rstar2_cli.launch.model_shape import QWEN3_14B

runner = CliRunner()


def rl(*args: str):
    return runner.invoke(app, ["rl", *args], terminal_width=250, env={"COLUMNS": "250"})


def test_a_cpu_plan_of_a_14b_stage_says_so():
    out = rl("--stage", "2", "--gpus", "0", "--dry-run")
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "--gpus 0: trains on this machine's CPU" in text
    assert f"{QWEN3_14B.total_params() / 1e9:.1f}B parameters" in text
    assert "give --gpus N" in text


def test_the_cpu_line_names_the_state_and_whether_it_fits():
    line, fits = mp.cpu_training_line(QWEN3_14B, "Qwen3-14B (assumed)", host_gib=24.0)
    need = 16 * QWEN3_14B.total_params() / mp.GIB
    assert not fits and f"{need:.0f} GiB" in line and "of 24 GiB" in line
    assert "\n" not in line
    line, fits = mp.cpu_training_line(QWEN3_14B, "x", host_gib=4096.0)
    assert fits


def test_a_known_model_too_large_for_the_host_is_refused(tmp_path, monkeypatch):
    model = tmp_path / "big"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 17408, "vocab_size": 151936, "tie_word_embeddings": False}))
    monkeypatch.setattr(mp, "host_memory_gib", lambda: 24.0)
    out = rl("--stage", "1", "--gpus", "0", "--dry-run", "--set", f"model.path={model}")
    assert out.exit_code == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: ")
    assert "--gpus 0" in out.stderr and "of 24 GiB" in out.stderr
