"""Isolation: a hostile answer times out, a dead grader is replaced, and the pool keeps working."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rstar2_cli.reward import GraderPool

HOSTILE = "<answer>\\boxed{9^{9^{9^{9}}}}</answer>"
HOSTILE_FACTORIAL = "<answer>\\boxed{10^{10^{10}}!}</answer>"
EASY = ("<answer>\\boxed{\\frac{2}{4}}</answer>", "\\frac{1}{2}")


@pytest.fixture()
def pool():
    with GraderPool(workers=1, chunk_size=8) as p:
        yield p


def test_timeout_gives_zero_and_the_rest_of_the_chunk_is_still_graded(pool: GraderPool):
    pairs = [(HOSTILE, "5"), EASY, (HOSTILE_FACTORIAL, "\\frac{1}{2}"), EASY]
    results = pool.grade_batch(pairs, timeout=1.0)
    assert [r.reason for r in results] == ["timeout", "correct", "timeout", "correct"]
    assert [r.reward for r in results] == [0.0, 1.0, 0.0, 1.0]
    assert results[0].extracted == "9^{9^{9^{9}}}"
    assert pool.grade(*EASY, timeout=5.0).reason == "correct"  # the replacement works


def test_killed_worker_is_replaced_and_its_item_is_a_crash(pool: GraderPool):
    pool.start()
    out: list = []
    runner = threading.Thread(target=lambda: out.extend(pool.grade_batch([(HOSTILE, "5"), EASY], timeout=120.0)))
    runner.start()
    deadline = time.monotonic() + 60
    while not pool.workers.busy_pids and time.monotonic() < deadline:
        time.sleep(0.05)
    (victim,) = pool.workers.busy_pids
    os.kill(victim, signal.SIGKILL)
    runner.join(timeout=60)
    assert not runner.is_alive()
    assert [r.reason for r in out] == ["grader_crash", "correct"]
    assert victim not in pool.workers.worker_pids
    assert pool.grade(*EASY).reason == "correct"


def test_closed_pool_refuses_work():
    p = GraderPool(workers=1)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.grade(*EASY)
