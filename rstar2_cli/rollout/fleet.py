"""A rollout host's engine fleet: its vLLM replicas as one, with what keeps them in step with the
policy: the scheduler over them, the supervisor that restarts a dead one, the version of the
weights they hold, sleep through an update and the weight push.

Why one object: the replicas, their restarts and the weights' version change together. A push
and a restart hold the same lock (`lock`), so a restarted replica never loads weights mid-update,
and a restart gives it what the live replicas hold (`_current_weights`: the start folder's
weights before the first push, then the policy's, stamped with `version`).

Versions: version v = the weights after v trainer steps. A push adds one; a step that trains
nothing adds one too (`keep_weights`: the unchanged weights are also the next step's). A resumed
run's replicas start at the checkpoint's step (AReaL #1342: a restored engine left at version 0).

The fleet starts no thread: its coroutines (and the roll-out's, `batch_rollout.py`) run on the event
loop the caller gives, which the synchronous trainer drives from its own thread (`run_on_loop`:
`run_until_complete`) and asynchronous RL runs in a thread of its own. Each replica has its own
loop thread besides (`engines.py`: vLLM's AsyncLLM is driven from it).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from rstar2_cli.config import RecipeConfig
from rstar2_cli.rollout.engine_args import default_max_model_len
from rstar2_cli.rollout.engine_health import EngineSupervisor
from rstar2_cli.rollout.engines import VLLMEngine
from rstar2_cli.rollout.scheduler import LoadBalancedScheduler
from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache
from rstar2_cli.rollout.weight_sync.engine_side import run_on_loop


def start_engines(cfg: RecipeConfig, gpu_groups: Sequence[Sequence[int] | None], *, first_replica: int,
                  tp_size: int, weights: str, weight_transfer: str, priority: bool = False,
                  make_engine: Callable[..., Any] = VLLMEngine.from_config) -> list[Any]:
    """One replica per entry of `gpu_groups` (node-local GPU ids, None: the default device), each
    loading `weights`, seeded `train.seed` + its global replica index. `tp_size`: the launch plan's
    tensor-parallel size (it wins over the recipe's). `priority`: vLLM's priority scheduling (lower
    `GenRequest.priority` first) instead of fcfs. `make_engine`: `VLLMEngine.from_config` (tests
    pass a fake with its signature)."""
    engine_cfg = cfg.engine
    if tp_size != engine_cfg.tensor_parallel_size:
        engine_cfg = engine_cfg.model_copy(update={"tensor_parallel_size": tp_size})
    max_len = default_max_model_len(cfg.rollout.max_response_tokens, cfg.engine.max_model_len)
    return [make_engine(weights, engine_cfg, max_model_len=max_len, seed=cfg.train.seed + first_replica + i,
                        gpu_ids=gpus, weight_transfer=weight_transfer,
                        scheduling_policy="priority" if priority else "fcfs",
                        sampling_logprobs=cfg.rollout.temperature != 1.0, seed_requests=cfg.rollout.seed_requests)
            for i, gpus in enumerate(gpu_groups)]


class EngineFleet:
    """This host's replicas (`engines`, [] on ranks that are not rollout hosts) and their weights.

    `pusher`: the `WeightPusher` over them (every rank has one: its gathers are collectives);
    `version`: the version the replicas hold; `max_restarts` / `restart_refused`: the supervisor's
    limit and why this run cannot restart a replica at all (None: it can); `release`: the trainer's
    cached device memory back before a restarted replica starts; `relabel`: the replicas stamp
    each token with its version (partial rollouts), so a step that keeps the weights relabels them."""

    def __init__(self, engines: Sequence[Any], pusher: Any, loop: asyncio.AbstractEventLoop, *, version: int,
                 max_restarts: int, restart_refused: str | None = None,
                 release: Callable[[], None] = release_trainer_cache, relabel: bool = False):
        self.engines, self.pusher, self.loop = list(engines), pusher, loop
        self.scheduler = LoadBalancedScheduler(self.engines) if self.engines else None
        self.version, self.relabel = version, relabel
        self._policy: Any = None                     # who pushed the live weights (None: the start folder)
        for e in self.engines:
            e.weights_version = version
        self.supervisor = EngineSupervisor(max_restarts=max_restarts, why_not=restart_refused,
                                           current_weights=self._current_weights, release=release)

    @property
    def lock(self):
        """Held while the weights change (update and push): no restart reads them meanwhile."""
        return self.supervisor.lock

    @property
    def restarts(self) -> int:
        return self.supervisor.restarts

    def sleep(self) -> None:
        """Colocated on GPU: the replicas sleep (level 2: weights and KV cache freed) for the update;
        else nothing. `push` wakes them."""
        self.pusher.sleep_engines()

    def heal(self) -> None:
        """Restart, now, every replica that counts as dead (a push would fail on it)."""
        self.supervisor.heal(self.engines)

    def push(self, policy: Any) -> None:
        """The policy's new weights into every replica (every rank: a collective); the next version."""
        self.pusher.push(policy)
        self.version, self._policy = self.version + 1, policy

    def keep_weights(self) -> None:
        """A step that trained nothing: the replicas' unchanged weights are the next version too."""
        with self.lock:
            self.version += 1
            for e in self.engines:
                e.weights_version += 1
        if self.relabel and self.engines:
            run_on_loop(self.loop, asyncio.gather(*(e.label_weights() for e in self.engines)))

    def _current_weights(self) -> tuple[list | None, int]:
        """What a restarted replica (built from the start folder) must hold: the policy's weights
        once one was pushed, and their version. Called holding `lock`: never mid-update."""
        named = None if self._policy is None else self._policy.full_state_for_engines(keep=True)
        return named, self.version

    def busy_seconds(self) -> list[float]:
        """Per replica: wall time so far with a request in flight."""
        return [e.busy_seconds() for e in self.engines]

    def close(self) -> None:
        """The pusher's resources, then every replica (on `loop`, which must not be closed yet)."""
        self.pusher.close()

        async def close_all() -> None:
            for e in self.engines:
                await e.close()

        if self.engines:
            run_on_loop(self.loop, close_all())
