"""benchmarks/gpu/check_gpu_apis.py (run by Dockerfile.rocm at build time) passes against the installed
vLLM 0.32 and torch, reads the APIs from the source, and fails on a missing API or parameter."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu" / "check_gpu_apis.py"
spec = importlib.util.spec_from_file_location("check_gpu_apis", SCRIPT)
apis = importlib.util.module_from_spec(spec)
sys.modules["check_gpu_apis"] = apis      # dataclasses look their module up while the script loads
spec.loader.exec_module(apis)


def test_every_gpu_api_the_code_calls_exists_in_the_installed_vllm_and_torch():
    run = subprocess.run([sys.executable, str(SCRIPT), str(REPO / "rstar2_cli")], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"vllm 0\.32\.\d+: \d+ APIs, \d+ uses checked", run.stdout)
    assert "MISSING" not in run.stdout


def test_the_source_reader_finds_the_calls_and_their_arguments():
    uses = apis.source_uses([REPO / "rstar2_cli"])
    called = {}
    for u in uses:
        if u.npos is not None:
            called.setdefault(u.target, set()).update(u.keywords)
    assert {"weight_transfer_config", "enable_sleep_mode", "worker_extension_cls"} <= \
        called["vllm.engine.arg_utils.AsyncEngineArgs"]
    assert {"rank", "packed"} <= called["vllm.distributed.weight_transfer.ipc_engine.IPCTrainerInitInfo"]
    # the factory is passed in (tests pass a fake), so its call is in the table the reader cannot infer
    factory = "vllm.distributed.weight_transfer.WeightTransferTrainerFactory.trainer_init"
    assert any(u.target == factory and {"client", "source"} <= u.keywords for u in apis.INSTANCE_CALLS)
    assert "mp_policy" in called["torch.distributed.fsdp.fully_shard"]
    assert {"backend", "timeout"} <= called["torch.distributed.init_process_group"]
    assert "vllm.sampling_params.RequestOutputKind.FINAL_ONLY" in {u.target for u in uses}


def test_every_method_called_on_the_vllm_engine_is_in_the_table():
    text = "\n".join(p.read_text() for p in (REPO / "rstar2_cli").rglob("*.py"))
    called = set(re.findall(r"_llm\.(\w+)\(", text)) | set(re.findall(r'_all\("(\w+)"', text))
    listed = {u.target.rsplit(".", 1)[1] for u in apis.INSTANCE_CALLS if u.target.startswith(apis.ASYNC_LLM + ".")}
    assert called and called <= listed, called - listed


@pytest.mark.parametrize(("use", "problem"), [
    (apis.Use("vllm.config.WeightTransferConfig", 0, frozenset({"backend", "no_such_option"})),
     "no_such_option"),
    (apis.Use("vllm.distributed.weight_transfer.NoSuchTrainerFactory"), "has no attribute 'NoSuchTrainerFactory'"),
    (apis.Use("vllm_no_such_package.thing"), "cannot import"),
    (apis.Use(f"{apis.ASYNC_LLM}.resume_generation", 1), "too many positional arguments"),
    (apis.Use("torch.distributed.TCPStore", 2, frozenset({"is_master", "no_such_flag"})), "no parameter no_such_flag"),
    (apis.Use("vllm.inputs.TokensPrompt", 0, frozenset({"prompt_token_ids", "no_such_key"})), "no key no_such_key"),
])
def test_a_missing_api_or_parameter_is_reported(use, problem):
    found = apis.check([use])
    assert len(found) == 1 and problem in found[0], found


def test_what_the_code_passes_binds():
    good = [apis.Use("vllm.config.WeightTransferConfig", 0, frozenset({"backend"})),
            apis.Use("torch.distributed.TCPStore", 2, frozenset({"is_master", "world_size", "timeout"})),
            apis.Use(f"{apis.ASYNC_LLM}.pause_generation", 0, frozenset({"mode", "clear_cache"}))]
    assert apis.check(good) == []
