"""vLLM's `VLLMWeightSyncClient` protocol (four blocking calls) over some of our replicas."""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any


class EngineSyncClient:
    """The four calls of vLLM's `VLLMWeightSyncClient`, each run on every replica's own
    event-loop thread at once and waited for (as vLLM's Ray client fans out to its actors).

    CUDA IPC handles are not msgpack-able, so an ipc payload travels pickled
    (`ipc_handles_pickled`, vLLM's own HTTP encoding); the engines were started with
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 to accept it. `in_update` is True between a
    `start_weight_update` and its `finish_weight_update`: vLLM has no abort, so a sender that
    fails in between must finish the update itself or say that the engines are mid-update."""

    def __init__(self, engines: Sequence[Any]):
        self.engines = list(engines)
        self.in_update = False

    def _all(self, method: str, *args: Any) -> None:
        futures: list[Future] = [e.submit_llm_call(method, *args) for e in self.engines]
        for f in futures:
            f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        # lazy: vLLM: imported only where it runs
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._all("init_weight_transfer_engine", WeightTransferInitRequest(init_info=init_info))

    def start_weight_update(self) -> None:
        self.in_update = True
        self._all("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        # lazy: vLLM: imported only where it runs
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
        # lazy: vLLM: imported only where it runs
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        self._all("update_weights", WeightTransferUpdateRequest(update_info=_json_safe_update_payload(update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update", weight_version)
        self.in_update = False
