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
the policy, the checkpoint, the rollout side, the weight pusher. The colocated cycle runs on
GPUs only, so the test turns it on (`Collaborators.engines_sleep`); the fake engines record the
sleep and wake calls it makes.
"""
from __future__ import annotations

import json

import pytest
from api_contracts import assert_fake_methods_match, assert_same_signature
from fake_replica import FakeReplica
from rl_synthetic import alternating_grades, tiny_rl_recipe

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.run.rollout_side import Collaborators
from rstar2_cli.rollout.engine_health import EngineSupervisor, HealthWatch


def test_the_fake_replica_has_the_engines_api():
    from rstar2_cli.rollout.engines import VLLMEngine

    assert_same_signature(FakeReplica.from_config.__func__, VLLMEngine.from_config.__func__)
    assert_fake_methods_match(FakeReplica, VLLMEngine, [
        "generate", "kv_free_fraction", "busy_seconds", "collective_rpc", "reset_prefix_cache", "sleep",
        "wake_up", "close", "restart", "pause_for_update", "resume_after_update"])


@pytest.fixture
def events(tiny_model, monkeypatch):
    """The shared event log: the fake engines, the release, and the two optimizer loads write to it."""
    from transformers import AutoTokenizer

    from rstar2_cli.rl.update import checkpoint

    log: list = []
    monkeypatch.setattr(FakeReplica, "log", log)
    monkeypatch.setattr(FakeReplica, "tokenizer", AutoTokenizer.from_pretrained(tiny_model))

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
    from rstar2_cli.rl.update.checkpoint import save_checkpoint
    from rstar2_cli.rl.update.policy import PolicyTrainer

    policy = PolicyTrainer(ModelConfig(path=str(tiny_model), gradient_checkpointing=False), OptimConfig(lr=1e-3),
                           LossConfig(), micro_batch_tokens=4096)
    batch = make_trajectories(4, seed=1)
    policy.update(batch, [1.0, -1.0, 1.0, -1.0])
    return save_checkpoint(path, policy, AutoTokenizer.from_pretrained(tiny_model), step=1, final=True)


def _names(log):
    return [e[0] if e[0] != "wake_up" else f"wake_{e[1]}" for e in log]


def test_release_comes_before_the_engines_start_and_before_every_wake_at_continuation_and_resume(
        events, tiny_model, tmp_path):
    from rstar2_cli.rl.run.trainer import RLTrainer

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

    # fake engines, sleeping through each update as on GPU; alternate grades: every group has a
    # signal, so every step updates and pushes
    collaborators = Collaborators(make_engine=FakeReplica.from_config, grade=alternating_grades, release=release,
                                  engines_sleep=lambda cfg, device: True)

    # stage continuation: AdamW continued, then released, then the engines start; one step
    trainer = RLTrainer(cfg, progress=False, collaborators=collaborators)
    trainer.train_step()
    trainer.save()
    trainer.close()
    continued = _names(events)
    cycle = ["sleep", "release", "wake_weights", "load_weights", "release", "wake_kv_cache"]
    assert continued == ["continue_optimizer", "release", "engine_start", *cycle], continued

    # --resume from that step: the checkpoint loaded, released, then the engines start; one step
    events.clear()
    trainer = RLTrainer(cfg, resume=True, progress=False, collaborators=collaborators)
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
