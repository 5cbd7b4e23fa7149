"""The nccl path (engines on their own GPUs): one NCCL group per replica (the host rank and the
replica's TP workers, formed by vLLM's `NCCLTrainerWeightTransferEngine.trainer_init`), fed by
ONE pass over the policy: every rank all-gathers each parameter once, in the engine's dtype, and
the host broadcasts each packed chunk of it to every replica's group in turn (`send_to_replicas`).

vLLM's own `send_weights` iterates its source once per sender, so with one sender per replica
every rank would gather the whole model once per replica. Here the senders are used for their
groups and clients only; the round trip is vLLM's (start, `update_weights` on a side thread while
the trainer broadcasts, finish), with vLLM's packing (`pack_tensors`, the chunk boundaries the
workers' `packed_nccl_broadcast_consumer` computes from the same metadata and buffer size).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import torch

from rstar2_cli.hosts.ports import PortReservation, reserve_port
from rstar2_cli.rollout.weight_sync.client import EngineSyncClient
from rstar2_cli.rollout.weight_sync.engine_side import MidUpdateError
from rstar2_cli.rollout.weight_sync.source import packed_buffer_bytes, policy_weight_source


def checked_pairs(source: Any, meta: list[Any]) -> Iterator[tuple[str, "torch.Tensor"]]:
    """The source's pairs, each checked against the metadata the workers were sent (they size
    their receive buffers and chunk boundaries from it; a mismatch would hang NCCL)."""
    n = 0
    for name, tensor in source:
        m = meta[n] if n < len(meta) else None
        if m is None or (name, tensor.dtype, tuple(tensor.shape)) != (m.name, m.dtype, tuple(m.shape)):
            raise ValueError(f"weight source yielded {name!r} {tensor.dtype} {tuple(tensor.shape)} at index {n}, "
                             f"metadata() declared {m}")
        n += 1
        yield name, tensor
    if n != len(meta):
        raise ValueError(f"weight source yielded {n} tensors, metadata() declared {len(meta)}")


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()


def send_to_replicas(source: Any, groups: Sequence[Any], client: EngineSyncClient, buffer_bytes: int) -> int:
    """One update of every replica behind `client` from one pass over `source`: each packed
    chunk (vLLM's `pack_tensors`, `buffer_bytes`) is broadcast from rank 0 to every group in
    `groups` (one `PyNcclCommunicator` per replica, on the current stream). Returns the number
    of chunks. A failure after the start raises `MidUpdateError` without finishing: the workers
    are blocked in their NCCL receive, so a finish would never return."""
    # lazy: vLLM: imported only where it runs
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo
    from vllm.distributed.weight_transfer.packed_tensor import pack_tensors  # lazy: vLLM: imported only where it runs

    meta = source.metadata()
    update_info = asdict(NCCLWeightTransferUpdateInfo(names=[m.name for m in meta],
                                                      dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
                                                      shapes=[list(m.shape) for m in meta]))
    chunks = 0
    client.start_weight_update()
    exe = ThreadPoolExecutor(max_workers=1)
    try:
        receiving = exe.submit(client.update_weights, update_info)   # the workers' side of the broadcasts
        if receiving.done():
            receiving.result()
        pairs = checked_pairs(source, meta)
        while (chunk := pack_tensors(pairs, lambda item: item[1], buffer_bytes)) is not None:
            for group in groups:
                group.broadcast(chunk.packed_tensor, src=0)
            chunks += 1
        receiving.result()
    except Exception as e:
        raise MidUpdateError("nccl", e, finished=False) from e
    finally:
        exe.shutdown(wait=False)
    client.finish_weight_update()
    _synchronize()
    return chunks


class NCCLTransport:
    """One NCCL group per host replica; one gather pass per update on every rank, whatever the
    number of replicas (non-host ranks only join the gathers)."""

    def __init__(self, model: "torch.nn.Module", engines: Sequence[Any], *, is_host: bool,
                 engine_dtype: "torch.dtype", trainer_factory: Any, port: Callable[[], PortReservation] = reserve_port):
        # lazy: vLLM: imported only where it runs
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        self.source = policy_weight_source(model, engine_dtype)
        self.buffer_bytes = packed_buffer_bytes(self.source.metadata())
        self.is_host = is_host
        self.client = EngineSyncClient(engines if is_host else [])
        self.senders = []
        for engine in (engines if is_host else []):
            # the port stays reserved until vLLM's store listens on it (trainer_init returns after the
            # rendezvous): no other process can take it in between (hosts/ports.py)
            with port() as reserved:
                info = NCCLTrainerInitInfo(master_address=reserved.host, master_port=reserved.port,
                                           world_size=1 + engine.tp_size, rank=0, packed=True,
                                           packed_buffer_size_bytes=self.buffer_bytes)
                self.senders.append(trainer_factory.trainer_init(info, client=EngineSyncClient([engine]),
                                                                 source=self.source))

    def send(self, policy: Any) -> None:
        if self.senders:
            send_to_replicas(self.source, [s.model_update_group for s in self.senders], self.client, self.buffer_bytes)
            return
        for _ in self.source:     # every rank gathers each parameter once, in the same order
            pass
        _synchronize()

    def close(self) -> None:
        for sender in self.senders:
            sender.shutdown()
        self.senders = []
