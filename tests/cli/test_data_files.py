"""Data files as users hand them over: a gzip-compressed .jsonl is read as its text by every command
that reads rows; binary data or a gzip stream cut short stops `rstar2 eval --data` with one line
before anything heavy (torch, transformers, vLLM) is imported or an output folder is made; and
`prepare sft` that converts none of a file's rows fails in one line and writes nothing (the
one-line refusals of every command are in test_bad_input.py)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app

REPO = Path(__file__).resolve().parents[2]
ROW = {"id": "p1", "problem": "What is 6 times 7?", "answer": "42"}
SFT_ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}

# The CLI as the console script runs it; after it exits, one more line lists the heavy modules it imported.
RUNNER = r"""
import sys
sys.argv[0] = "rstar2"
from rstar2_cli.cli import app
try:
    app()
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules)
print("imported: " + ",".join(heavy))
sys.exit(code)
"""


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, gzip.compress(jsonl([ROW] * 300))[:60]],
                         ids=["binary", "gzip-cut-short"])
def test_eval_refuses_unreadable_data_before_importing_the_engine(tmp_path, stub_checkpoint, content):
    data = tmp_path / "set.jsonl"
    data.write_bytes(content)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-c", RUNNER, "eval", "custom", str(stub_checkpoint), "--data", str(data),
                           "--out", str(tmp_path / "ev")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: --data {data}: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout.strip() == "imported:", proc.stdout     # no torch, transformers or vLLM
    assert not (tmp_path / "ev").exists()


def test_eval_reads_a_gzip_data_file(tmp_path):
    from rstar2_cli.commands import checks
    from rstar2_cli.eval.family import MathFamily
    from rstar2_cli.eval.settings import EvalSettings

    data = tmp_path / "set.jsonl.gz"
    data.write_bytes(gzip.compress(jsonl([ROW, {**ROW, "id": "p2"}])))
    checks.data_file(data, "--data")        # passes: no typer.Exit
    problems = MathFamily().load(EvalSettings(benchmark="custom", model="m", data=str(data)))
    assert [(p.id, p.answer, p.source) for p in problems] == [("p1", "42", "set"), ("p2", "42", "set")]


def test_prepare_math_and_sft_read_gzip_files(tmp_path):
    source = tmp_path / "pool.jsonl.gz"
    source.write_bytes(gzip.compress(jsonl([ROW])))
    (tmp_path / "held_out.jsonl").write_bytes(jsonl([{"id": "e1", "problem": "Name a prime above 90.",
                                                      "answer": "97"}]))
    out = CliRunner().invoke(app, ["prepare", "math", "--source", str(source), "--out", str(tmp_path / "m.jsonl"),
                                   "--eval-set", str(tmp_path / "held_out.jsonl"), "--no-hub"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["problem"], r["answer"], r["source"]) for r in rows] == [(ROW["problem"], "42", "pool")]

    chat = tmp_path / "chat.jsonl"          # gzip under a plain .jsonl name is read the same way
    chat.write_bytes(gzip.compress(jsonl([SFT_ROW, SFT_ROW])))
    out = CliRunner().invoke(app, ["prepare", "sft", str(chat), "-o", str(tmp_path / "s.jsonl"), "-f", "openai"])
    assert out.exit_code == 0, out.output
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 2


def test_prepare_sft_that_converts_nothing_fails_and_writes_nothing(tmp_path):
    src = tmp_path / "problems.jsonl"
    src.write_bytes(jsonl([ROW, ROW, ROW]))
    out_file = tmp_path / "sft.jsonl"
    out = CliRunner().invoke(app, ["prepare", "sft", str(src), "-o", str(out_file), "-f", "sharegpt"])
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {src}: 0 of 3 rows convert as --format sharegpt "
                                                   f"(line 1: "), out.output
    assert not out_file.exists() and not (tmp_path / "sft.jsonl.stats.json").exists()
    assert list(tmp_path.iterdir()) == [src]          # no temporary file left either
