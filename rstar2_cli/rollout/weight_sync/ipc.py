"""The ipc path (engines colocated with the trainer): vLLM's `IPCTrainerWeightTransferEngine`,
packed, with one IPC buffer per trainer rank sized from the model (`packed_buffer_bytes`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rstar2_cli.rollout.weight_sync.client import EngineSyncClient
from rstar2_cli.rollout.weight_sync.engine_side import MidUpdateError
from rstar2_cli.rollout.weight_sync.source import packed_buffer_bytes, policy_weight_source

if TYPE_CHECKING:
    import torch


class IPCTransport:
    """One packed IPC sender over all of this node's replicas (`IPCTrainerInitInfo`), built on
    every trainer rank (all join the gathers and the handle all-gather; vLLM's sender is "rank 0",
    so every node's host is given rank 0). The buffer (`buffer_mb` MiB, or sized from the model)
    is checked against the largest tensor here, before any engine is touched. A send that fails
    once the engines started the update finishes it and raises `MidUpdateError`."""

    def __init__(self, model: "torch.nn.Module", engines: Sequence[Any], *, is_host: bool, rank: int,
                 engine_dtype: "torch.dtype", trainer_factory: Any, buffer_mb: int | None = None):
        # lazy: vLLM: imported only where it runs
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        source = policy_weight_source(model, engine_dtype)
        self.buffer_bytes = packed_buffer_bytes(source.metadata(), buffer_mb)
        self.client = EngineSyncClient(engines)
        info = IPCTrainerInitInfo(rank=0 if is_host else max(1, rank), packed=True,
                                  packed_buffer_size_bytes=self.buffer_bytes)
        self.sender = trainer_factory.trainer_init(info, client=self.client, source=source)

    def send(self, policy: Any) -> None:
        try:
            self.sender.send_weights()
        except Exception as e:
            if not self.client.in_update:
                raise
            try:
                self.client.finish_weight_update()
                finished = True
            except Exception:
                finished = False
            raise MidUpdateError("ipc", e, finished=finished) from e

    def close(self) -> None:
        self.sender.shutdown()
