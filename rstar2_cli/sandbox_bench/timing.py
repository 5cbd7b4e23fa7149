"""What every bench-tools row measures: calls at a fixed concurrency, and latency percentiles."""
from __future__ import annotations

import asyncio
import time

import numpy as np


def percentile_ms(seconds: list[float], q: float) -> float:
    """The q-th percentile of latencies in seconds, in ms (numpy's linear method), 2 decimals."""
    return round(float(np.percentile(seconds, q)) * 1000, 2)


async def timed(n: int, concurrency: int, one) -> tuple[float, list[float], list[str]]:
    """Run `one()` n times, `concurrency` at a time; (seconds, latencies, failure notes)."""
    gate = asyncio.Semaphore(concurrency)
    latencies, failures = [], []

    async def run() -> None:
        async with gate:
            t0 = time.perf_counter()
            note = await one()
            latencies.append(time.perf_counter() - t0)
            if note:
                failures.append(note)

    start = time.perf_counter()
    await asyncio.gather(*(run() for _ in range(n)))
    return time.perf_counter() - start, latencies, failures
