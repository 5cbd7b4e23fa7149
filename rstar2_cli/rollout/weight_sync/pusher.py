"""`WeightPusher`: the one interface the trainer uses to move new weights into the engines.

Built on every trainer rank (every path gathers the FSDP shards with collectives; only host ranks
talk to engines). Around any path it does the engine side once: pause (asynchronous RL) or refuse
while generations are in flight; for colocated engines on GPU, wake their weights before the push
and their KV cache after it (`colocated.ColocatedCycle`); then drop the prefix cache (no KV
computed with old weights is reused) and bump each replica's `weights_version`. The path itself is
a `WeightTransport` chosen by `make_transport`.

Every rank reaches the same collectives whatever fails on a host: the releases before each wake
(barriers) run on every rank, and before the transfer, whose gathers are collectives tensor by
tensor (FSDP's `full_tensor`), the ranks agree on the host's check and wake (`agree`; the trainer's
is one all-gather over the gloo group, `rl/run/rollout_side.py`). A host whose engines are busy or
fail to wake (an out-of-memory on `wake_up(["weights"])`) thus stops every rank at once, where
the others would otherwise wait in the gathers until the collective timeout (2 h).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rstar2_cli.hosts.ports import PortReservation, reserve_port
from rstar2_cli.rollout.weight_sync.chunked import ChunkedTransport
from rstar2_cli.rollout.weight_sync.colocated import ColocatedCycle, release_trainer_cache
from rstar2_cli.rollout.weight_sync.engine_side import (attempt, check_idle, each, raise_failure, run_on_loop,
                                                       weights_loaded)
from rstar2_cli.rollout.weight_sync.ipc import IPCTransport
from rstar2_cli.rollout.weight_sync.nccl import NCCLTransport

if TYPE_CHECKING:
    import torch


class WeightTransport(Protocol):
    """One path's way of moving a full set of new weights into this node's engines. `send` runs on
    every trainer rank (the gathers are collectives); the host's engines are idle or paused (and
    awake) when it starts, and `WeightPusher` does the rest of the engine side after it."""

    def send(self, policy: Any) -> None: ...
    def close(self) -> None: ...


def make_transport(backend: str, *, model: "torch.nn.Module", engines: Sequence[Any], is_host: bool,
                   engine_dtype: "torch.dtype", rank: int, run: Callable[[Coroutine], Any],
                   trainer_factory: Any = None, port: Callable[[], PortReservation] = reserve_port,
                   ipc_buffer_mb: int | None = None) -> WeightTransport:
    """The transport of `backend` (`choose_backend`'s answer). `trainer_factory` is vLLM's
    `WeightTransferTrainerFactory` unless given (tests pass a fake). `ipc_buffer_mb`: the
    recipe's `engine.ipc_buffer_mb` (None: sized from the model)."""
    if backend not in ("ipc", "nccl", "chunked"):
        raise ValueError(f"weight transfer backend {backend!r}: expected ipc, nccl or chunked")
    if backend == "chunked":
        return ChunkedTransport(engines, is_host=is_host, run=run)
    if trainer_factory is None:
        # lazy: vLLM: imported only where it runs
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory as trainer_factory
    if backend == "ipc":
        return IPCTransport(model, engines, is_host=is_host, rank=rank, engine_dtype=engine_dtype,
                            trainer_factory=trainer_factory, buffer_mb=ipc_buffer_mb)
    return NCCLTransport(model, engines, is_host=is_host, engine_dtype=engine_dtype,
                         trainer_factory=trainer_factory, port=port)


class WeightPusher:
    """Pushes the policy's weights into this node's engines after each update (every rank).

    `backend`: "ipc", "nccl" or "chunked" (`choose_backend`). `engines`: this node's replicas on
    its host rank, [] elsewhere. `loop`: the rollout loop the engines' coroutines run on (None: a
    fresh `asyncio.run` each time). `pause`: asynchronous RL, rollouts run during the update
    (`VLLMEngine.pause_for_update`). `colocated`: the engines share the GPUs with the trainer
    (engine.colocate on GPU): `sleep_engines` before the update, and `push` wakes them, calling
    `release` (the trainer's cached memory back to the driver, then a barrier) before each wake.
    `agree`: called on every rank before the transfer with this rank's failure of the check or the
    wake (None if none); it raises on every rank if any rank failed (module docstring; alone: the
    failure itself). `trainer_factory`, `port`, `ipc_buffer_mb`: see `make_transport`."""

    def __init__(self, backend: str, *, model: "torch.nn.Module", engines: Sequence[Any], is_host: bool,
                 engine_dtype: "torch.dtype", rank: int, loop: asyncio.AbstractEventLoop | None = None,
                 trainer_factory: Any = None, port: Callable[[], PortReservation] = reserve_port, pause: bool = False,
                 colocated: bool = False, ipc_buffer_mb: int | None = None,
                 release: Callable[[], None] = release_trainer_cache,
                 agree: Callable[[BaseException | None], None] = raise_failure):
        self.backend, self.engines, self.is_host, self.loop = backend, list(engines), is_host, loop
        self.pause, self.agree = pause, agree
        self.cycle = ColocatedCycle(self.engines if is_host else [], self._run, release) if colocated else None
        self.transport = make_transport(backend, model=model, engines=self.engines, is_host=is_host,
                                        engine_dtype=engine_dtype, rank=rank, run=self._run,
                                        trainer_factory=trainer_factory, port=port, ipc_buffer_mb=ipc_buffer_mb)

    def sleep_engines(self) -> None:
        """Colocated: put this node's engines to sleep (level 2) so training has the GPUs; a
        no-op otherwise. The next `push` wakes them."""
        if self.cycle is not None:
            self.cycle.sleep()

    def push(self, policy) -> None:
        """New weights into every engine of this node; a collective over all trainer ranks.
        With `pause`, each host engine is paused (running turns finish, new ones queue) for the
        load and resumed after it; without, a generation in flight is an error (`check_idle`).
        Colocated: weights woken before the load, KV cache after it. A failure of the check or the
        wake raises on every rank before the transfer (`agree`, module docstring)."""
        paused = self.pause and self.is_host and bool(self.engines)
        if paused:
            self._run(each(self.engines, "pause_for_update"))
        try:
            self.agree(self._ready(paused))
            failure = attempt(lambda: self.transport.send(policy))
            if self.cycle is not None:
                self.cycle.release()                  # every rank, even where the send failed
                if failure is None:
                    failure = attempt(lambda: self.cycle.wake("kv_cache"))
            raise_failure(failure)
            if self.is_host:
                self._run(weights_loaded(self.engines))
        finally:
            if paused:
                self._run(each(self.engines, "resume_after_update"))

    def _ready(self, paused: bool) -> BaseException | None:
        """This node's engines made ready for the transfer: idle (or `paused`) and, colocated, their
        weights awake. Returns what failed, or None; the release runs on every rank regardless
        (a barrier every rank must reach)."""
        failure = attempt(lambda: check_idle(self.engines, paused))
        if self.cycle is not None:
            self.cycle.release()
            if failure is None:
                failure = attempt(lambda: self.cycle.wake("weights"))
        return failure

    def _run(self, coro) -> None:
        if self.loop is None:
            asyncio.run(coro)
        else:
            run_on_loop(self.loop, coro)

    def close(self) -> None:
        self.transport.close()
