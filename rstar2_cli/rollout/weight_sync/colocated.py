"""Engines that share the node's GPUs with the trainer (`engine.colocate` on GPU): how they give
the GPUs to training and take them back around the weight push.

  sleep       before the update, vLLM's level 2 (`AsyncLLM.sleep(level=2)`): the weights and the
              KV cache are discarded (`CuMemBackend.suspend` backs up only its "runtime" and
              "cudagraph" pools), not copied to pinned host RAM as at level 1 (at TP 2 that is
              ~112 GB per node and two copies per step, for weights the push overwrites).
              vLLM's worker keeps every registered buffer (`Worker.sleep`: `named_buffers()` to
              host, restored at `wake_up(["weights"])`), so the rotary cos/sin caches and the
              attention scales come back; every parameter comes back through the push
              (`benchmarks/gpu/gpu_shapes_check.py` checks that the push fills all of them).
  wake        after the update, on every trainer rank: `torch.cuda.empty_cache()` (the trainer's
              caching allocator would keep its training memory from the engine), a barrier (the
              GPU's memory is free on every rank before the host wakes engines whose TP workers
              sit on other ranks' GPUs), then the host wakes the weights; the push; the same
              again, then the KV cache (the push's own buffers are freed first).
The same release runs before the engines first start and before a dead engine's restart
(`rl/run/rollout_side.py`, `rollout/engine_health.py`): the trainer passes it down (`RLTrainer`'s
`release`), so a test can record when it runs.
"""
from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from rstar2_cli.rollout.weight_sync.engine_side import each

SLEEP_LEVEL = 2


def release_trainer_cache() -> None:
    """Give the trainer's cached, unused GPU memory back to the driver on every rank, and wait
    until all ranks have (a collective when a process group exists). Without CUDA, or before it
    is initialised, `torch.cuda.empty_cache` does nothing (torch/cuda/memory.py `empty_cache`)."""
    import torch  # lazy: the agent loop imports this module (engine_health), and --help loads no torch (cli.py)

    torch.cuda.empty_cache()
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


class ColocatedCycle:
    """Sleep and wake of this node's colocated engines. Every trainer rank has one (`engines` is
    [] off the host); `run` runs a coroutine on the engines' loop."""

    def __init__(self, engines: Sequence[Any], run: Callable[[Coroutine], Any],
                 release: Callable[[], None] = release_trainer_cache):
        self.engines, self.run, self.release = list(engines), run, release

    def sleep(self) -> None:
        if self.engines:
            self.run(each(self.engines, "sleep", level=SLEEP_LEVEL))

    def wake(self, tag: str) -> None:
        """This node's engines take back their `tag` memory ("weights", "kv_cache"); nothing off
        the host. The caller runs `release` first, on every rank (a collective)."""
        if self.engines:
            self.run(each(self.engines, "wake_up", [tag]))
