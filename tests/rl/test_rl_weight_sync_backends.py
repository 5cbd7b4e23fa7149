"""Which weight-sync backend a placement gets, what it tells the engine at start-up, and the
recipe's IPC buffer field: the choices made before any weights move."""
from __future__ import annotations

import os

import pytest

from rstar2_cli.rollout.weight_sync.backends import choose_backend, engine_weight_sync_args


@pytest.mark.parametrize("requested, on_gpu, colocate, expected", [
    ("auto", False, True, "chunked"), ("auto", True, True, "ipc"), ("auto", True, False, "nccl"),
    ("chunked", True, True, "chunked"), ("nccl", True, False, "nccl"), ("ipc", True, True, "ipc"),
])
def test_backend_follows_engine_placement(requested, on_gpu, colocate, expected):
    assert choose_backend(requested, on_gpu=on_gpu, colocate=colocate) == expected


@pytest.mark.parametrize("requested, on_gpu, colocate, fragment", [
    ("ipc", False, True, "needs GPUs"), ("ipc", True, False, "needs engine.colocate=true"),
    ("nccl", True, True, "needs engine.colocate=false"), ("rdma", True, True, "expected one of"),
])
def test_impossible_backend_is_one_line_error(requested, on_gpu, colocate, fragment):
    with pytest.raises(ValueError, match=fragment) as e:
        choose_backend(requested, on_gpu=on_gpu, colocate=colocate)
    assert "\n" not in str(e.value) and "engine.weight_transfer" in str(e.value)


@pytest.mark.parametrize("backend", ["chunked", "ipc", "nccl"])
def test_engine_args_name_the_worker_extension_and_vllms_transfer_backend(backend, monkeypatch):
    import importlib

    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    args = engine_weight_sync_args(backend)
    module, _, name = args["worker_extension_cls"].rpartition(".")
    assert hasattr(getattr(importlib.import_module(module), name), "rstar2_load_weight_chunk")
    transfer = args["weight_transfer_config"]
    assert (transfer is None) if backend == "chunked" else (transfer.backend == backend)
    # only ipc payloads travel pickled (EngineSyncClient), so only ipc engines accept them
    assert (os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == "1") == (backend == "ipc")


def test_recipe_ipc_buffer_field_defaults_to_the_model_and_rejects_nonsense():
    from pydantic import ValidationError

    from rstar2_cli.config import EngineConfig

    assert EngineConfig().ipc_buffer_mb is None
    assert EngineConfig(ipc_buffer_mb=2048).ipc_buffer_mb == 2048
    with pytest.raises(ValidationError):
        EngineConfig(ipc_buffer_mb=0)
