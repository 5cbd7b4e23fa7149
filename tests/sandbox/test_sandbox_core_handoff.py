"""The hand-off between a caller's event loop and the pool's private one (sandbox.core.handoff)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from sandbox.core.handoff import Bridge


@pytest.fixture
def pool_loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


async def test_results_and_exceptions_cross_back_and_calls_run_on_the_pool_thread(pool_loop):
    bridge = Bridge(pool_loop)

    async def where(i):
        await asyncio.sleep(0.001 * (i % 3))
        return i, threading.current_thread().name

    async def boom():
        raise KeyError("nope")

    got = await asyncio.gather(*(bridge.call(where, i) for i in range(200)))
    assert [i for i, _ in got] == list(range(200))
    assert {name for _, name in got} == {next(t.name for t in threading.enumerate() if t.ident == pool_loop._thread_id)}
    with pytest.raises(KeyError):
        await bridge.call(boom)


async def test_cancelling_the_caller_cancels_the_work_on_the_pool_loop(pool_loop):
    bridge = Bridge(pool_loop)
    started, cancelled = threading.Event(), threading.Event()

    async def slow():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.ensure_future(bridge.call(slow))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(cancelled.wait, 5)


def test_one_pool_serves_callers_on_several_loops_in_turn(pool_loop):
    bridge = Bridge(pool_loop)

    async def double(x):
        return 2 * x

    for x in range(3):  # each asyncio.run is a fresh caller loop, as in scripts and per-test loops
        assert asyncio.run(bridge.call(double, x)) == 2 * x
