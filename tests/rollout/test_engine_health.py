"""Engine death: a replica that dies or hangs mid-rollout is seen within the health bound, restarted
with the current weights, and the trajectories it interrupted are rolled out again with their own
seeds, so the step's data equals an unfailed run's; past engine.max_restarts the rollout raises
EngineRestartsExhausted and the trainer checkpoints and aborts with one line.

The engine here is a fake replica (`SeededReplica`) whose tokens depend on the request's seed and
prompt only, as a seeded vLLM request's do; its `generate` and `restart` have `VLLMEngine`'s
signatures, and what `HealthWatch` reads of vLLM (`AsyncLLM.errored`, `EngineDeadError`,
`AsyncLLM.shutdown(timeout)`) is checked against the installed vLLM."""
from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from api_contracts import assert_same_signature

from rstar2_cli.config import ConfigError, EngineConfig, RolloutConfig, load_recipe
from rstar2_cli.models.tiny import build_tokenizer, default_corpus
from rstar2_cli.protocol import format_tool_call
from rstar2_cli.rollout.agent_loop import run_agent_loop
from rstar2_cli.rollout.engine_health import (EngineDied, EngineRestartsExhausted, EngineSupervisor, HealthWatch,
                                              engine_core_processes)
from rstar2_cli.rollout.engines import GenResult, VLLMEngine
from rstar2_cli.rollout.scheduler import LoadBalancedScheduler
from sandbox.core.result import RunResult

CHECK_S, TIMEOUT_S = 0.05, 0.4
PROBLEMS = [(f"p{i}", f"What is {i}*7?", str(7 * i)) for i in range(6)]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(default_corpus(0), 512)


def turn_text(seed: int) -> str:
    """A seeded turn: a tool call or the answer, chosen by the seed."""
    rng = random.Random(seed)
    if rng.random() < 0.6:
        args = {"code": f"print({rng.randint(1, 99)} * 7)", "input": ""}
        return (f"Let me compute.</reason>\n<tool_call>\n{format_tool_call('python_code_with_standard_io', args)}"
                f"\n</tool_call><|im_end|>")
    return f"It is {rng.randint(1, 99)}.</reason>\n<answer>$\\boxed{{{rng.randint(1, 9)}}}$</answer><|im_end|>"


class SeededReplica:
    """A replica whose tokens depend on (seed, prompt length) only. `die_after=n`: the n+1-th
    request kills it ("dead": `errored` turns true, as vLLM's flag does when the EngineCore process
    exits; "hang": nothing answers and nothing says so); every request in flight then never
    answers, as on a dead or stopped engine core."""

    kv_capacity_tokens = 100_000
    pause_mode = "wait"

    def __init__(self, tok, die_after: int | None = None, mode: str = "dead"):
        self.tok, self.die_after, self.mode = tok, die_after, mode
        self.down = False
        self.calls = 0
        self.weights_version = 0
        self.died_at = self.restarted_at = None
        self.restarts: list[tuple[object, int]] = []
        self.health = HealthWatch(lambda: self.down and self.mode == "dead", lambda: False,
                                  check_s=CHECK_S, timeout_s=TIMEOUT_S)

    def kv_free_fraction(self) -> float:
        return 1.0

    async def generate(self, req) -> GenResult:
        return await self.health.guard(self._sample(req), self)

    async def _sample(self, req) -> GenResult:
        self.calls += 1
        if self.die_after is not None and self.calls > self.die_after and self.died_at is None:
            self.down, self.died_at = True, time.monotonic()
        await asyncio.sleep(0.01)
        if self.down:
            await asyncio.Event().wait()          # never answers
        self.health.beat()
        ids = self.tok.encode(turn_text(req.seed), add_special_tokens=False)
        ids = ids[:req.max_tokens]
        stop = ids[-1] if ids and ids[-1] in req.stop_token_ids else None
        rng = random.Random(req.seed)
        return GenResult(
            token_ids=ids,
            logprobs=[-rng.random() for _ in ids],
            finish_reason="stop" if stop else "length",
            stop_token_id=stop,
            policy_version=self.weights_version,
        )

    def restart(self, weights, version: int) -> None:
        self.restarted_at = time.monotonic()
        self.down, self.die_after = False, None
        self.weights_version = version
        self.restarts.append((weights, version))


class OkRunner:
    async def run_batch(self, items, timeout=None):
        return [RunResult(stdout="42\n", stderr="", exit_code=0, wall_time=0.01, reason="ok") for _ in items]


def test_the_fakes_match_the_real_apis():
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    assert_same_signature(SeededReplica.generate, VLLMEngine.generate)
    assert_same_signature(SeededReplica.restart, VLLMEngine.restart)
    assert_same_signature(SeededReplica.kv_free_fraction, VLLMEngine.kv_free_fraction)
    assert isinstance(inspect.getattr_static(AsyncLLM, "errored"), property)   # HealthWatch's death flag
    assert isinstance(inspect.getattr_static(AsyncLLM, "dead_error"), property)
    assert "timeout" in inspect.signature(AsyncLLM.shutdown).parameters     # VLLMEngine.restart's shutdown
    assert issubclass(EngineDeadError, Exception)


def rollout(tok, engines, supervisor=None, seed=5):
    sched = LoadBalancedScheduler(engines)
    cfg = RolloutConfig(max_turns=3, max_response_tokens=400)
    return asyncio.run(run_agent_loop(PROBLEMS, 2, sched, OkRunner(), tok, cfg, seed=seed, progress=False,
                                      recover=None if supervisor is None else supervisor.recover))


def data(trajs):
    return [(t.prompt_id, t.sample_index, t.response_ids, t.loss_mask, t.logprobs, t.finish_reason, t.num_turns)
            for t in trajs]


def supervisor_for(max_restarts=3, version=4, weights="current"):
    return EngineSupervisor(max_restarts=max_restarts, current_weights=lambda: (weights, version))


@pytest.mark.parametrize("mode,bound", [("dead", CHECK_S), ("hang", TIMEOUT_S + CHECK_S)])
def test_a_replica_that_dies_mid_rollout_is_restarted_and_the_step_data_is_unchanged(tok, mode, bound):
    baseline = rollout(tok, [SeededReplica(tok), SeededReplica(tok)])
    assert "error" not in {t.finish_reason for t in baseline}
    assert any(t.num_turns > 1 for t in baseline)              # multi-turn trajectories are rolled out again too
    dying = SeededReplica(tok, die_after=3, mode=mode)
    sup = supervisor_for()
    trajs = rollout(tok, [dying, SeededReplica(tok)], sup)
    assert data(trajs) == data(baseline)                          # same seeds -> the same step data
    assert sup.restarts == 1 and dying.restarts == [("current", 4)]   # the current weights and version
    assert dying.weights_version == 4 and dying.health.generation == 1 and dying.health.failed is None
    seen = dying.restarted_at - dying.died_at
    assert seen < bound + 0.5, f"{mode}: restart {seen:.2f} s after the fault (bound {bound} s)"


def test_without_recover_an_engine_death_is_an_error_trajectory(tok):
    trajs = rollout(tok, [SeededReplica(tok, die_after=2), SeededReplica(tok)])
    failed = [t for t in trajs if t.finish_reason == "error"]
    assert failed and all(t.infra_error == "engine_error" and "engine died" in t.error for t in failed)


def test_past_max_restarts_the_rollout_raises_one_line(tok):
    sup = supervisor_for(max_restarts=0)
    with pytest.raises(EngineRestartsExhausted) as e:
        rollout(tok, [SeededReplica(tok, die_after=2), SeededReplica(tok)], sup)
    msg = str(e.value)
    assert "\n" not in msg and "engine.max_restarts=0" in msg and "AsyncLLM.errored" in msg


def test_a_run_that_cannot_restart_says_why(tok):
    sup = EngineSupervisor(max_restarts=3, current_weights=lambda: (None, 0), why_not="a sharded policy")
    with pytest.raises(EngineRestartsExhausted, match="not restarted: a sharded policy"):
        rollout(tok, [SeededReplica(tok, die_after=2)], sup)


def test_a_restart_waits_while_the_weights_change(tok):
    sup = supervisor_for()
    dying = SeededReplica(tok, die_after=2)
    held, released = threading.Event(), []

    def trainer():                             # the trainer updates and pushes the weights
        with sup.lock:
            held.set()
            time.sleep(0.3)
            released.append(time.monotonic())
    threading.Thread(target=trainer).start()
    held.wait()
    rollout(tok, [dying], sup)
    assert dying.restarted_at >= released[0]


def test_health_watch_bounds():
    async def main():
        flag = {"dead": False, "paused": False}
        watch = HealthWatch(lambda: flag["dead"], lambda: flag["paused"], check_s=CHECK_S, timeout_s=TIMEOUT_S)
        # paused for a weight update: no steps, no hang
        flag["paused"] = True
        assert await watch.guard(asyncio.sleep(2 * TIMEOUT_S, result="ok")) == "ok"
        flag["paused"] = False

        async def beating():                    # slow, but every step beats: not hung
            for _ in range(int(2 * TIMEOUT_S / 0.05)):
                await asyncio.sleep(0.05)
                watch.beat()
            return "done"
        assert await watch.guard(beating()) == "done"
        started = time.monotonic()
        with pytest.raises(EngineDied, match="engine.health_timeout_s"):
            await watch.guard(asyncio.Event().wait())
        assert time.monotonic() - started < TIMEOUT_S + CHECK_S + 0.3
        with pytest.raises(EngineDied):          # once failed, it fails at once until reset
            await watch.guard(asyncio.sleep(0))
        watch.reset()
        assert await watch.guard(asyncio.sleep(0, result=1)) == 1
        flag["dead"] = True
        with pytest.raises(EngineDied, match="AsyncLLM.errored"):
            await watch.guard(asyncio.Event().wait())
    asyncio.run(main())


def test_vllm_dead_error_from_generate_counts_as_death():
    from vllm.v1.engine.exceptions import EngineDeadError

    async def boom():
        raise EngineDeadError()

    async def main():
        watch = HealthWatch(lambda: False, lambda: False, check_s=CHECK_S, timeout_s=TIMEOUT_S)
        with pytest.raises(EngineDied, match="EngineDeadError"):
            await watch.guard(boom())
    asyncio.run(main())


def test_health_settings_are_validated_at_load(tmp_path):
    with pytest.raises(ValueError, match="health_timeout_s=1 is shorter than engine.health_check_s=5"):
        EngineConfig(health_check_s=5, health_timeout_s=1)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("engine:\n  max_restarts: -1\n")
    with pytest.raises(ConfigError, match="max_restarts"):
        load_recipe(recipe)
    assert EngineConfig().max_restarts >= 0


def test_engine_core_processes_finds_children_by_name(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "EngineCore_fake.py"
    script.write_text("import time\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, str(script)])
    try:
        for _ in range(50):
            found = [p.pid for p in engine_core_processes()]
            if child.pid in found:
                break
            time.sleep(0.05)
        assert child.pid in found
    finally:
        child.kill()
        child.wait()


def test_max_restarts_checkpoints_and_aborts_with_one_line(tmp_path, monkeypatch):
    """RLTrainer.train: EngineRestartsExhausted from a step -> the step's batch abandoned (drawn
    again on resume), a checkpoint of the last completed step, RunAborted with one line."""
    from rstar2_cli.config import RecipeConfig
    from rstar2_cli.rl.run import trainer as trainer_mod

    calls = []
    t = object.__new__(trainer_mod.RLTrainer)
    t.cfg = RecipeConfig()
    t.step, t.saved_step, t.last_checkpoint = 2, 0, None
    t.info = SimpleNamespace(device=None)
    t.source = SimpleNamespace(abandon=lambda index: calls.append(("abandon", index)))
    t.writer = SimpleNamespace(plot=lambda: None)
    t.close = lambda: calls.append(("close",))

    def save(final=False):
        calls.append(("save", t.step))
        return Path(tmp_path / f"step_{t.step:06d}")

    def step():
        raise EngineRestartsExhausted(
            "engine died: no engine step for 600 s; engine.max_restarts=3 restart(s) already done"
        )
    t.save, t.train_step = save, step
    with pytest.raises(trainer_mod.RunAborted) as e:
        t.train()
    assert calls == [("abandon", 2), ("save", 2), ("close",)]
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("step 3: engine died") and "step_000002 holds step 2" in msg
