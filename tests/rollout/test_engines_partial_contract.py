"""The calls partial rollouts make on vLLM's `AsyncLLM` (pause mode "keep", the weight-version
label) bind to the installed AsyncLLM's signatures."""
from __future__ import annotations

import asyncio
import threading

from test_engine_llm_contract import CheckedLLM

from rstar2_cli.rollout.engines import VLLMEngine


def test_keep_mode_pauses_with_keep_and_labels_the_new_version_before_resuming():
    engine = VLLMEngine.__new__(VLLMEngine)      # no engine process: only its calls on AsyncLLM
    engine._llm, engine._loop = CheckedLLM(), asyncio.new_event_loop()
    engine.weights_version, engine._pending_version = 3, None
    engine.pause_mode = "keep"
    thread = threading.Thread(target=engine._loop.run_forever, daemon=True)
    thread.start()

    async def cycle():
        await engine.pause_for_update()
        engine.weights_version += 1               # the load (weight_sync.engine_side.weights_loaded)
        await engine.resume_after_update()

    try:
        asyncio.run(cycle())
    finally:
        engine._loop.call_soon_threadsafe(engine._loop.stop)
        thread.join(timeout=10)
    calls = engine._llm.calls
    assert [c[0] for c in calls] == ["pause_generation", "update_weight_version", "resume_generation"]
    assert calls[0][2] == {"mode": "keep", "clear_cache": True}
    assert calls[1][1] == ("4",)

