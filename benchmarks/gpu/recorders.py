"""Recording stand-ins for the weight sync's far ends, shared by benchmarks/gpu/gpu_shapes_check.py
and the RL tests: a replica's NCCL group and the engine client record what they are sent, and a
counting source counts the passes over the trainer's weights (each pass all-gathers the model)."""
from __future__ import annotations


class RecordingGroup:
    """A replica's NCCL group (PyNcclCommunicator.broadcast's signature): records the bytes."""

    def __init__(self):
        self.sizes: list[int] = []

    def broadcast(self, tensor, src, stream=None):
        self.sizes.append(tensor.numel() * tensor.element_size())


class RecordingClient:
    def __init__(self):
        self.calls: list[str] = []
        self.update_info = None

    def start_weight_update(self):
        self.calls.append("start")

    def update_weights(self, update_info):
        self.calls.append("update")
        self.update_info = update_info

    def finish_weight_update(self, weight_version=None):
        self.calls.append("finish")


class CountingSource:
    def __init__(self, source):
        self.source, self.passes, self.bytes = source, 0, 0

    def metadata(self):
        return self.source.metadata()

    def __iter__(self):
        self.passes += 1
        for name, t in self.source:
            self.bytes += t.numel() * t.element_size()
            yield name, t
