"""The engine side of every weight-sync path: refuse busy replicas, then drop their prefix
caches and bump their `weights_version` once the new weights are in."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any


def check_idle(engines: Sequence[Any], paused: bool) -> None:
    """Refuse an update while a replica has generations in flight, unless the replicas were
    paused for it (`pause_for_update`, asynchronous RL: requests may be queued)."""
    busy = [e.inflight for e in engines if e.inflight]
    if busy and not paused:
        raise RuntimeError(f"weight update with {busy[0]} generation(s) in flight; finish the rollout first")


def attempt(action: Callable[[], Any]) -> Exception | None:
    """Run `action`; the exception it raised, or None. For a rank that must still reach the
    collectives after it (a barrier, an agreement) before it raises."""
    try:
        action()
    except Exception as e:
        return e
    return None


def raise_failure(failure: BaseException | None) -> None:
    """The agreement of a process alone: its own failure, raised (nothing when None)."""
    if failure is not None:
        raise failure


async def weights_loaded(engines: Sequence[Any]) -> None:
    """The new weights are in: drop each replica's prefix cache and bump its `weights_version`."""
    await asyncio.gather(*(e.reset_prefix_cache() for e in engines))
    for e in engines:
        e.weights_version += 1


async def each(engines: Sequence[Any], method: str, *args: Any, **kwargs: Any) -> None:
    """`await engine.<method>(*args, **kwargs)` on every replica at once."""
    await asyncio.gather(*(getattr(e, method)(*args, **kwargs) for e in engines))


def run_on_loop(loop: asyncio.AbstractEventLoop, coro) -> Any:
    """Run `coro` on `loop` from this thread and return its result: directly when the loop is
    idle, through `run_coroutine_threadsafe` when another thread runs it (asynchronous RL keeps
    the rollout loop running in its own thread)."""
    if loop.is_running():
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
    return loop.run_until_complete(coro)


class MidUpdateError(RuntimeError):
    """A push failed after the engines had started loading new weights (one-line message)."""

    def __init__(self, backend: str, error: BaseException, *, finished: bool):
        first = (str(error).splitlines() or [""])[0]
        left = ("the engines were told to finish the update with the weights received so far (the rest "
                "hold their old values, undefined after a level-2 sleep)" if finished else
                "the engines are left mid-update (vLLM has no abort)")
        super().__init__(f"weight sync ({backend}) failed after the engines started the update "
                         f"({type(error).__name__}: {first}); {left}: restart the run from its last checkpoint")
