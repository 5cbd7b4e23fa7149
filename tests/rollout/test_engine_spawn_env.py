"""An engine spawned from a torchrun worker starts without torchrun's agent-store variables (whose
`tcp://` rendezvous would wait forever for a store nobody hosts), and a colocated engine runs vLLM's
V1 model runner; the trainer's own environment is unchanged afterwards."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from api_contracts import assert_same_signature

from rstar2_cli.rollout.engine_env import engine_spawn_env
from rstar2_cli.rollout.engines import VLLMEngine

# What vLLM's engine workers do at start-up (vllm/distributed/parallel_state.py
# `init_distributed_environment` with a `tcp://` distributed_init_method), one rank.
RENDEZVOUS = """
import datetime, socket, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=3))
dist.destroy_process_group()
print("rendezvous ok")
"""


def spawn_rendezvous() -> subprocess.CompletedProcess:
    """A child started with this process's environment, as vLLM's engine core is."""
    return subprocess.run([sys.executable, "-c", RENDEZVOUS], capture_output=True, text=True, timeout=120)


def test_a_torchrun_workers_environment_hangs_an_engines_rendezvous_unless_scrubbed(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")      # as torchrun's agent sets it
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    inherited = spawn_rendezvous()
    assert inherited.returncode != 0 and "rendezvous ok" not in inherited.stdout   # rank 0 is only a client
    with engine_spawn_env(sleep_mode=False):
        scrubbed = spawn_rendezvous()
    assert scrubbed.returncode == 0, scrubbed.stderr[-2000:]
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True" and os.environ["TORCHELASTIC_RUN_ID"] == "job"


def test_sleep_mode_pins_the_v1_runner_and_a_users_choice_stands():
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "PATH": "/bin"}
    with engine_spawn_env(sleep_mode=True, env=env):
        assert env == {"VLLM_USE_V2_MODEL_RUNNER": "0", "PATH": "/bin"}
    assert env == {"TORCHELASTIC_USE_AGENT_STORE": "True", "PATH": "/bin"}
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    with engine_spawn_env(sleep_mode=True, env=env):
        assert env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def test_the_pin_makes_vllm_choose_the_v1_runner_where_it_would_choose_v2(monkeypatch):
    """vLLM's own choice (`VllmConfig.use_v2_model_runner`) under `engine_spawn_env`: V1 with sleep
    mode, V2 without it and where the user asked for V2, on a config where vLLM picks V2 by itself
    (Triton present, as on a GPU node; this CPU box has none)."""
    import vllm.config.vllm as vllm_config

    config = vllm_config.VllmConfig()
    monkeypatch.setattr(vllm_config, "HAS_TRITON", True)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert config.use_v2_model_runner is True
    with engine_spawn_env(sleep_mode=True):
        assert config.use_v2_model_runner is False
    with engine_spawn_env(sleep_mode=False):
        assert config.use_v2_model_runner is True
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with engine_spawn_env(sleep_mode=True):
        assert config.use_v2_model_runner is True


@pytest.mark.parametrize("on_gpu,sleep_mode", [(False, False), (True, True), (True, False)])
def test_the_engine_is_built_in_the_scrubbed_environment(monkeypatch, on_gpu, sleep_mode):
    """`VLLMEngine._start` hands vLLM (which spawns the engine core inside `from_engine_args`) an
    environment without TORCHELASTIC_*; with sleep mode (colocated on GPU) also the V1 pin."""
    import torch
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    seen: dict[str, str] = {}

    def from_engine_args(engine_args, start_engine_loop=True, usage_context=UsageContext.ENGINE_CONTEXT,
                         stat_loggers=None):
        seen.update(os.environ)
        return "llm"

    assert_same_signature(from_engine_args, AsyncLLM.from_engine_args)
    monkeypatch.setattr(AsyncLLM, "from_engine_args", from_engine_args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: on_gpu)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    args = AsyncEngineArgs(model="unused", enable_sleep_mode=sleep_mode, enforce_eager=True)
    assert asyncio.run(VLLMEngine._start(VLLMEngine.__new__(VLLMEngine), args)) == "llm"
    assert seen and "TORCHELASTIC_USE_AGENT_STORE" not in seen
    assert seen.get("VLLM_USE_V2_MODEL_RUNNER") == ("0" if sleep_mode else None)
    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True" and "VLLM_USE_V2_MODEL_RUNNER" not in os.environ


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_an_engines_processes_outlive_the_preemption_warning_that_slurm_sends_the_whole_step(method):
    """srun passes a signal to every process of the step (hosts/child_signals.py): USR1 ends a
    process started outside the window (its default action), not one started inside it, and the
    trainer's own mask is as it was."""
    import multiprocessing
    import signal
    import time

    ctx = multiprocessing.get_context(method)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with engine_spawn_env(sleep_mode=False):
        shielded = ctx.Process(target=time.sleep, args=(30,))
        shielded.start()
    bare = ctx.Process(target=time.sleep, args=(30,))
    bare.start()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before
    try:
        for proc in (shielded, bare):
            os.kill(proc.pid, signal.SIGUSR1)
        bare.join(10)
        shielded.join(1)
        assert bare.exitcode == -signal.SIGUSR1
        assert shielded.is_alive()
    finally:
        for proc in (shielded, bare):
            proc.kill()
            proc.join()
