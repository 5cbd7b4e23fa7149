"""The environment every vLLM engine process is spawned with, on any device: none of torchrun's
agent variables, vLLM's V1 model runner for a colocated (sleeping) engine, and SIGUSR1 blocked
(the preemption warning is the trainer's: hosts/child_signals.py).

torchrun's agent: its workers, the trainer ranks that spawn the engines, get
`TORCHELASTIC_USE_AGENT_STORE=True` (torch/distributed/elastic/agent/server/local_elastic_agent.py,
`_start_workers`, with TORCHELASTIC_RUN_ID, _RESTART_COUNT, _MAX_RESTARTS, and _ERROR_FILE from
torch/distributed/elastic/multiprocessing/api.py). With that variable set, torch's `tcp://`
rendezvous makes every rank, rank 0 too, a client of a TCPStore it assumes the agent hosts
(torch/distributed/rendezvous.py, `_create_c10d_store`). An engine's workers rendezvous among
themselves over `tcp://` on a port of their own (vLLM's `distributed_init_method`; on ROCm with
AITER's custom all-reduce it is `tcp://`, not `file://`), where no agent listens: every rank waits
for a server that never comes and the engine start times out. TORCHELASTIC_RUN_ID is what
`torch.distributed.is_torchelastic_launched()` reads, and TORCHELASTIC_ERROR_FILE is where
`@record` writes a failure, the trainer rank's own file. So an engine process starts with no
`TORCHELASTIC_*` variable; RANK, LOCAL_RANK, WORLD_SIZE and MASTER_* stay: vLLM reads them only
for `env://` (the external launcher, not used here), and its `tcp://`/`file://` rendezvous takes
rank and world size as arguments.

Model Runner V2 (vllm/config/vllm.py `use_v2_model_runner`: V2 wherever Triton is installed and no
unsupported feature is asked for, else `VLLM_USE_V2_MODEL_RUNNER` decides): V1 is pinned
(`VLLM_USE_V2_MODEL_RUNNER=0`) for engines built with sleep mode, because level-2 sleep restores
only the model's parameters and buffers (vllm/v1/worker/gpu_worker.py `sleep`/`wake_up`) and V2's
persistent GPU state (v1/worker/gpu/states.py, input buffers, CUDA graphs) has never been through
a sleep/wake cycle in rstar2's tests, which all ran V1. A variable the user set is kept.

vLLM's logging config: the run folder's (`engine_logs.spawn_env`, unless --verbose).

Only the spawn sees these changes: `engine_spawn_env` restores this process's environment after it.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, MutableMapping

from rstar2_cli.hosts.child_signals import children_shielded
from rstar2_cli.rollout.engine_logs import spawn_env

AGENT_ENV_PREFIX = "TORCHELASTIC_"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
# One window at a time: two engines started from two threads (a restart beside a start) would
# otherwise save and restore each other's changes and one spawn could see the agent variables.
_WINDOW = threading.RLock()


@contextlib.contextmanager
def engine_spawn_env(*, sleep_mode: bool, env: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """Around `AsyncLLM.from_engine_args` (vLLM builds its config and spawns the engine core
    inside it): drop torchrun's `TORCHELASTIC_*` variables and, for an engine with `sleep_mode`,
    pin the V1 model runner (module docstring); restore both afterwards. The engine's processes
    start with SIGUSR1 blocked (`children_shielded`)."""
    with _WINDOW, children_shielded():
        removed = {name: env[name] for name in list(env) if name.startswith(AGENT_ENV_PREFIX)}
        for name in removed:
            del env[name]
        pinned = sleep_mode and V2_RUNNER_ENV not in env
        if pinned:
            env[V2_RUNNER_ENV] = "0"
        logs = {k: v for k, v in spawn_env().items() if k not in env}    # vLLM's log lines to the run folder
        env.update(logs)
        try:
            yield
        finally:
            if pinned:
                env.pop(V2_RUNNER_ENV, None)
            for name in logs:
                env.pop(name, None)
            env.update(removed)
