"""A stand-in for `VLLMEngine` that answers at once, for tests of the trainer with its real rollout
side (fleet, scheduler, agent loop, sandbox client, weight pusher): every turn is
`The answer is \\boxed{seed % 3}.` and end of turn, and `log` records what a test of the step's
order cares about (start, sleep, wake, weight loads); the weights a push loads are kept in
`loaded`. Its signatures are checked against `VLLMEngine`'s (test_rl_cache_release.py)."""
from __future__ import annotations

import asyncio

from rstar2_cli.rollout.engine_health import HealthWatch
from rstar2_cli.rollout.generation import GenResult


class FakeReplica:
    log: list = []          # set per test (monkeypatch.setattr(FakeReplica, "log", [...]))
    tokenizer = None        # set per test: the tiny model's tokenizer
    kv_capacity_tokens = 10_000
    weight_chunk_bytes = 1 << 20
    pause_mode = "wait"
    max_model_len = 4096

    def __init__(self):
        self.weights_version, self.inflight = 0, 0
        self.loaded: dict = {}
        self.health = HealthWatch(lambda: False, lambda: False, check_s=1.0, timeout_s=60.0)
        self.log.append(("engine_start",))

    @classmethod
    def from_config(cls, model_path, cfg, max_model_len, seed=0, *, kv_cache_tokens=None, dtype="auto",
                    gpu_ids=None, weight_transfer="chunked", scheduling_policy="fcfs", sampling_logprobs=False,
                    seed_requests="auto"):
        return cls()

    async def generate(self, req) -> GenResult:
        ids = self.tokenizer.encode(f"The answer is \\boxed{{{req.seed % 3}}}.", add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        await asyncio.sleep(0)
        return GenResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                         stop_token_id=self.tokenizer.eos_token_id, policy_version=self.weights_version)

    def kv_free_fraction(self) -> float:
        return 1.0

    def busy_seconds(self) -> float:
        return 0.0

    async def collective_rpc(self, method, *args):
        if method == "rstar2_begin_weight_update":
            self.log.append(("load_weights",))
        elif method == "rstar2_load_weight_chunk":
            from safetensors.torch import load

            self.loaded.update(load(args[0]))
        return [None]

    async def reset_prefix_cache(self):
        pass

    async def pause_for_update(self):
        pass

    async def resume_after_update(self):
        pass

    async def sleep(self, level=2):
        self.log.append(("sleep", level))

    async def wake_up(self, tags=None):
        self.log.append(("wake_up", tags[0]))

    async def close(self):
        pass

    def restart(self, weights, version):
        self.log.append(("engine_restart",))
