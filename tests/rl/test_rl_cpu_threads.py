"""rl/ranks/cpu_threads.py: a CPU trainer keeps off its engine's cores while the engine decodes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rstar2_cli.rl.ranks.cpu_threads import TrainerThreads
from rstar2_cli.rollout.engine_cpus import engine_process_env, reserved_cpus

CPU = torch.device("cpu")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def test_reserved_cpus_follow_vllms_auto_binding():
    assert reserved_cpus(1, {}) == 1 and reserved_cpus(2, {}) == 2        # its local world size
    assert reserved_cpus(1, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "3"}) == 3
    with pytest.raises(ValueError, match=r"VLLM_CPU_NUM_OF_RESERVED_CPU='two': expected an integer"):
        reserved_cpus(1, {"VLLM_CPU_NUM_OF_RESERVED_CPU": "two"})


def test_synchronous_update_takes_every_cpu_and_rollouts_keep_to_the_reserved_ones(threads):
    plan = TrainerThreads("auto", CPU, engines_here=True, env={})
    assert torch.get_num_threads() == 1                                    # rollouts, evals, weight push
    with plan.alone():
        assert torch.get_num_threads() == 4                                # the update: engines idle
    assert torch.get_num_threads() == 1
    plan.restore()
    assert torch.get_num_threads() == 4


def test_overlapped_update_stays_beside_the_engine(threads):
    plan = TrainerThreads("auto", CPU, engines_here=True, overlapped=True, tensor_parallel_size=2, env={})
    with plan.alone():
        assert torch.get_num_threads() == 2                                # the engine decodes meanwhile


@pytest.mark.parametrize("kwargs", [dict(plan="all", device=CPU, engines_here=True),
                                    dict(plan="auto", device=torch.device("cuda"), engines_here=True),
                                    dict(plan="auto", device=CPU, engines_here=False)])
def test_plan_leaves_torch_alone_off_cpu_without_local_engines_or_when_told(threads, kwargs):
    plan = TrainerThreads(**kwargs, env={})
    with plan.alone():
        assert torch.get_num_threads() == 4
    assert torch.get_num_threads() == 4


def test_engine_core_is_spawned_with_the_reserved_threads_unless_the_user_set_them():
    env: dict[str, str] = {}
    with engine_process_env(1, eager=False, env=env):
        assert env == {"OMP_NUM_THREADS": "1"}
    assert env == {}                                                       # the trainer's own env is left as it was
    env = {"OMP_NUM_THREADS": "3"}
    with engine_process_env(1, eager=False, env=env):
        assert env["OMP_NUM_THREADS"] == "3"
    assert env == {"OMP_NUM_THREADS": "3"}


def test_an_eager_engine_core_is_spawned_without_torch_compile_unless_the_user_said_otherwise():
    env: dict[str, str] = {}
    with engine_process_env(1, eager=True, env=env):
        assert env == {"OMP_NUM_THREADS": "1", "TORCH_COMPILE_DISABLE": "1"}
    assert env == {}
    env = {"TORCH_COMPILE_DISABLE": "0"}
    with engine_process_env(1, eager=True, env=env):
        assert env["TORCH_COMPILE_DISABLE"] == "0"
    assert env == {"TORCH_COMPILE_DISABLE": "0"}


def test_the_trainer_process_keeps_torch_compile_while_an_eager_engine_starts():
    """The variable is for the spawned engine core: torch.compile in this process still compiles
    afterwards, also when torch._dynamo was first imported inside the window."""
    code = ("import os, torch\n"
            "from rstar2_cli.rollout.engine_cpus import engine_process_env\n"
            "with engine_process_env(1, eager=True):\n"
            "    assert os.environ['TORCH_COMPILE_DISABLE'] == '1'\n"
            "    import torch._dynamo\n"
            "assert 'TORCH_COMPILE_DISABLE' not in os.environ\n"
            "print(torch._dynamo.config.disable)\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DISABLE"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"
