"""The trainer gives its cached device memory back before anything that starts or wakes an engine.

Why: continuing AdamW at a stage continuation (`checkpoint.continue_optimizer`) or a `--resume`
(`checkpoint.load_checkpoint`) allocates zero gradients and runs one foreach AdamW step; the freed
blocks stay in the trainer process's caching allocator, and vLLM's worker compares the GPU's free
memory with `gpu_memory_utilization x total` at start (vllm/v1/worker/gpu_worker.py
`Worker.init_device` -> vllm/v1/worker/utils.py `request_memory`) and refuses to start. So
`RLTrainer` takes the release as a collaborator (`rollout/weight_sync/colocated.release_trainer_cache`
by default: `torch.cuda.empty_cache()`, then a barrier) and the rollout side calls it on every rank
before the host starts its engines, before each colocated wake, and before an engine restart.

The engines are fakes of `VLLMEngine` (signatures checked); everything else is the real trainer:
the policy, the checkpoint, the rollout service, the weight pusher. The colocated cycle runs on
GPUs only, so the test turns it on (`rollout_service.engines_sleep_for_training`); the fake
engines record the sleep and wake calls it makes.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from api_contracts import assert_fake_methods_match, assert_same_signature
from rl_synthetic import tiny_rl_recipe

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rollout.engine_health import EngineSupervisor, HealthWatch
from rstar2_cli.rollout.generation import GenResult


class FakeReplica:
    """A replica as the rollout service drives it: answers `\\boxed{seed % 3}` and end of turn, and
    writes to `log` what a memory check cares about (start, sleep, wake, weight loads)."""

    log: list = []
    tokenizer = None
    kv_capacity_tokens = 10_000
    weight_chunk_bytes = 1 << 20
    pause_mode = "wait"

    def __init__(self):
        self.weights_version, self.inflight = 0, 0
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
                         stop_token_id=self.tokenizer.eos_token_id)

    def kv_free_fraction(self) -> float:
        return 1.0

    def busy_seconds(self) -> float:
        return 0.0

    async def collective_rpc(self, method, *args):
        if method == "rstar2_begin_weight_update":
            self.log.append(("load_weights",))
        return [None]

    async def reset_prefix_cache(self):
        pass

    async def sleep(self, level=2):
        self.log.append(("sleep", level))

    async def wake_up(self, tags=None):
        self.log.append(("wake_up", tags[0]))

    async def close(self):
        pass

    def restart(self, weights, version):
        self.log.append(("engine_restart",))


def test_the_fake_replica_has_the_engines_api():
    from rstar2_cli.rollout.engines import VLLMEngine

    assert_same_signature(FakeReplica.from_config.__func__, VLLMEngine.from_config.__func__)
    assert_fake_methods_match(FakeReplica, VLLMEngine, [
        "generate", "kv_free_fraction", "busy_seconds", "collective_rpc", "reset_prefix_cache", "sleep",
        "wake_up", "close", "restart"])


@pytest.fixture
def events(tiny_model, monkeypatch):
    """The shared event log: the fake engines, the release, and the two optimizer loads write to it."""
    from transformers import AutoTokenizer

    import rstar2_cli.reward as reward
    from rstar2_cli.reward import GradeResult
    from rstar2_cli.rl import checkpoint, rollout_service
    from rstar2_cli.rollout import engines

    log: list = []
    monkeypatch.setattr(FakeReplica, "log", log)
    monkeypatch.setattr(FakeReplica, "tokenizer", AutoTokenizer.from_pretrained(tiny_model))
    monkeypatch.setattr(engines, "VLLMEngine", FakeReplica)
    monkeypatch.setattr(rollout_service, "engines_sleep_for_training", lambda cfg, device: True)
    # alternate grades: every group has a signal, so every step updates and pushes
    monkeypatch.setattr(reward, "grade_batch", lambda pairs, **kw: [
        GradeResult.of("correct" if i % 2 == 0 else "wrong", "x") for i in range(len(pairs))])
    def logged(name):
        real = getattr(checkpoint, name)

        def call(*args, **kwargs):
            log.append((name,))
            return real(*args, **kwargs)
        return call

    for name in ("continue_optimizer", "load_checkpoint"):
        monkeypatch.setattr(checkpoint, name, logged(name))
    return log


def _stage1_checkpoint(tiny_model, path):
    """An RL checkpoint with AdamW state: what stage 2 continues."""
    from transformers import AutoTokenizer

    from rl_synthetic import make_trajectories
    from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
    from rstar2_cli.rl.checkpoint import save_checkpoint
    from rstar2_cli.rl.policy import PolicyTrainer

    policy = PolicyTrainer(ModelConfig(path=str(tiny_model), gradient_checkpointing=False), OptimConfig(lr=1e-3),
                           LossConfig(), micro_batch_tokens=4096)
    batch = make_trajectories(4, seed=1)
    policy.update(batch, [1.0, -1.0, 1.0, -1.0])
    return save_checkpoint(path, policy, AutoTokenizer.from_pretrained(tiny_model), step=1, final=True)


def _names(log):
    return [e[0] if e[0] != "wake_up" else f"wake_{e[1]}" for e in log]


def test_release_comes_before_the_engines_start_and_before_every_wake_at_continuation_and_resume(
        events, tiny_model, tmp_path):
    from rstar2_cli.rl.trainer import RLTrainer

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(4)))
    raw = tiny_rl_recipe(_stage1_checkpoint(tiny_model, tmp_path / "stage1" / "final"), data, tmp_path / "run",
                         steps=2)
    raw.update(stage=2, init_from="stage1")
    raw["sandbox"] = {"url": "http://127.0.0.1:9"}       # a client only: the fake engines call no tool
    cfg = load_recipe_dict(raw)

    def release():
        events.append(("release",))

    # stage continuation: AdamW continued, then released, then the engines start; one step
    trainer = RLTrainer(cfg, progress=False, release=release)
    trainer.train_step()
    trainer.save()
    trainer.close()
    continued = _names(events)
    cycle = ["sleep", "release", "wake_weights", "load_weights", "release", "wake_kv_cache"]
    assert continued == ["continue_optimizer", "release", "engine_start", *cycle], continued

    # --resume from that step: the checkpoint loaded, released, then the engines start; one step
    events.clear()
    trainer = RLTrainer(cfg, resume=True, progress=False, release=release)
    assert trainer.step == 1
    trainer.train_step()
    trainer.close()
    resumed = _names(events)
    assert resumed == ["load_checkpoint", "release", "engine_start", *cycle], resumed


def test_an_engine_restart_releases_first():
    log: list = []

    class Dead(FakeReplica):
        def __init__(self):
            self.log, self.weights_version = log, 0
            self.health = HealthWatch(lambda: True, lambda: False, check_s=1.0, timeout_s=60.0)

    def current_weights():
        log.append(("current_weights",))
        return None, 3

    sup = EngineSupervisor(max_restarts=1, current_weights=current_weights, release=lambda: log.append(("release",)))
    sup.heal([Dead()])
    assert log == [("current_weights",), ("release",), ("engine_restart",)]
