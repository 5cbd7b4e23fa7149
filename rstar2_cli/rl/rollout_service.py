"""The rollout side of an RL run: this process's vLLM engines and sandbox, the event loop that
drives them, the weight pusher, and the exchange of rolled-out shards between the nodes.

Placement (`rollout_hosts.py`): the local rank 0 of every node is that node's rollout host. It
starts the node's vLLM replicas on the GPUs the launch plan names (`RSTAR2_ENGINE_GPU_IDS`,
`RSTAR2_ENGINE_TP`; without them `engine.replicas` replicas on its default device) and a sandbox
(the embedded pool, or `sandbox.url`: the Redis cluster), then rolls out and grades its
interleaved node-shard of each batch through its own load-balanced scheduler (`start`). The
hosts broadcast their shards and every rank reassembles them in the global prompt order
(`exchange`), so RoC, advantages and the update see the same list on every rank as with a single
host. Sampling seeds depend on the step, the prompt id and the sample index only, so which node
rolls a prompt out changes nothing. After the update each host pushes the weights into its
engines (`push_weights`: `rollout/weight_sync/`, vLLM's weight transfer on GPU, ipc or
nccl; chunked safetensors on CPU), every rank joining the gathers. On one process (CPU
quickstart, single GPU) rank 0 is the only host and nothing is sent anywhere.

Threads: the rollouts run on this object's event loop, in a thread of its own (`rstar2-rollouts`),
so the trainer's thread only waits for a batch (`RolloutPipeline` in `async_rollouts.py` decides
when each batch starts: at its own step, or up to `train.max_staleness` steps ahead). Each engine
runs on its own loop thread besides (`rollout/engines.py`).

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
from rstar2_cli.rl.rollout_hosts import RolloutHostPlan, host_ranks, reassemble
from rstar2_cli.rollout.trajectory import Trajectory
from rstar2_cli.rollout.weight_sync.engine_side import run_on_loop

log = logging.getLogger(__name__)

# What a rollout host produces for one batch: (positions of its node-shard in the batch,
# trajectories graded, {"time/rollout": s, "time/reward": s}); None on ranks that are not hosts.
Piece = tuple[list[int], list[Trajectory], dict[str, float]]


def _empty_piece(positions: list[int]) -> Piece:
    """What a host with no prompts in this batch contributes to the exchange."""
    return positions, [], {"time/rollout": 0.0, "time/reward": 0.0}


class RolloutService:
    """This rank's part of the rollout phase (engines and sandbox on rollout hosts only; the
    weight pusher and the exchange on every rank: they are collectives).

    `problems`: the training problems (a batch names them by index); `weights`: the folder the
    engines load (the start model, or the checkpoint resumed); `version`: the step it holds."""

    def __init__(self, cfg: RecipeConfig, problems: list, tokenizer: Any, host: RolloutHostPlan,
                 info: rl_dist.DistInfo, *, model: Any, weights: str, version: int, progress: bool):
        from rstar2_cli.rollout.weight_sync.backends import choose_backend

        self.cfg, self.problems, self.tokenizer, self.host, self.info = cfg, problems, tokenizer, host, info
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
                                           current_weights=self._current_weights)

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
                                               scheduling_policy="priority" if partial else "fcfs")
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
        return rl_dist.all_reduce_max([mine], self.info.device)[0]

    def _weight_pusher(self, model: Any):
        from rstar2_cli.rl.policy import compute_dtype
        from rstar2_cli.rollout.weight_sync.pusher import WeightPusher

        # rollouts run ahead (max_staleness >= 1): the engines pause between requests for the load;
        # colocated on GPU: the engines sleep (level 2) through the update and the push wakes them
        return WeightPusher(self.weight_transfer, model=model, engines=self.engines,
                            is_host=self.host.is_host, rank=self.info.rank,
                            engine_dtype=compute_dtype("auto", self.info.device), loop=self.loop,
                            pause=bool(self.cfg.train.max_staleness), ipc_buffer_mb=self.cfg.engine.ipc_buffer_mb,
                            colocated=self.cfg.engine.colocate and self.info.device.type == "cuda")

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
    def start(self, index: int, problem_indices: list[int]) -> concurrent.futures.Future | None:
        """Start this host's rollout and grading of batch `index` (the problems at
        `problem_indices`) on the rollout thread; its future gives this host's Piece. None on
        ranks that are not rollout hosts."""
        from rstar2_cli.rollout.agent_loop import occurrences, run_agent_loop

        if not self.host.is_host:
            return None
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

        return asyncio.run_coroutine_threadsafe(produce(), self.loop)

    def _grade(self, trajs: list[Trajectory]) -> None:
        from rstar2_cli import reward   # looked up at call time: tests replace reward.grade_batch

        cfg = self.cfg
        grades = reward.grade_batch([(t.text, t.gold) for t in trajs], timeout=cfg.reward.timeout,
                                    mode=cfg.reward.mode, workers=cfg.reward.workers)
        for t, g in zip(trajs, grades):
            t.reward, t.extracted, t.grade_reason = g.reward, g.extracted, g.reason

    def exchange(self, n_batch: int, local: Callable[[], Piece | None]
                 ) -> tuple[list[Trajectory], dict[str, float], dict[str, float]]:
        """Every host contributes its node-shard (`local()`: its Piece, once rolled out); every
        rank gets all trajectories in the global prompt order, the seconds of the step's rollout
        phase ({"rollout", "reward"}: the slowest host's; "tools": mean per trajectory) and,
        with more than one node, how many trajectories each node rolled out."""
        piece: Any = None
        if self.host.is_host:
            try:
                piece = local()
            except Exception as e:
                if not rl_dist.is_distributed():
                    raise
                log.exception("rollout failed on this node")
                piece = f"node {self.host.node_index}: {e!r}"   # tell the other ranks, then fail
            else:
                for t in piece[1]:
                    t.extra["node"] = self.host.node_index
        pieces = self.gather_from_hosts(piece)
        errors = [p for p in pieces if isinstance(p, str)]
        if errors:
            raise RuntimeError(f"rollout failed on {errors[0]}")
        trajs = reassemble([(p[0], p[1]) for p in pieces], n_batch, self.cfg.rollouts_per_prompt)
        seconds = {k: max(p[2][f"time/{k}"] for p in pieces) for k in ("rollout", "reward")}
        seconds["tools"] = float(sum(t.tool_time for t in trajs)) / max(1, len(trajs))
        per_node = ({f"rollout/trajectories_node{n}": float(len(p[1])) for n, p in enumerate(pieces)}
                    if len(pieces) > 1 else {})
        return trajs, seconds, per_node

    def gather_from_hosts(self, mine: Any) -> list[Any]:
        """Each rollout host's `mine`, in node order, on every rank (a collective)."""
        return rl_dist.broadcast_from_each(mine, self.host_ranks)

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
        the engines' weights wake before the load and their KV cache after it."""
        with self.supervisor.lock:
            if self.host.is_host:
                self.supervisor.heal(self.engines)   # a replica found dead now is restarted first
            self.weights_out.push(policy)
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
