"""The Redis worker supervisor replaces dead workers while the queue answers, and stops with one
line (exit 1) once they keep dying with Redis gone, instead of restarting them for ever."""
from __future__ import annotations

import signal
import sys
import time

import pytest

from sandbox.redis_mode.launch import supervise, wait_for_redis

DIES_AT_ONCE = [sys.executable, "-c", "raise SystemExit(3)"]


def test_workers_dying_with_redis_gone_end_the_supervisor(capsys):
    started = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        supervise(DIES_AT_ONCE, procs=2, poll=0.05, queue_down=lambda: "Connection refused", give_up_s=0.5)
    assert stop.value.code == 1 and time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "error: sandbox workers: Redis has not answered for 0.5 s (Connection refused); stopping" in err
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_workers_dying_while_redis_answers_are_replaced(monkeypatch):
    """Deaths with the queue up never end the supervisor; an interrupt does (the test's timer)."""
    asked = []

    def queue_up():
        asked.append(1)
        if len(asked) >= 5:
            raise KeyboardInterrupt    # stop the test's supervisor after five replacements
        return None

    supervise(DIES_AT_ONCE, procs=1, poll=0.05, queue_down=queue_up, give_up_s=0.01)
    assert len(asked) == 5
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_wait_for_redis_says_why_a_closed_port_does_not_answer():
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        why = wait_for_redis(f"redis://127.0.0.1:{closed.getsockname()[1]}/0", 0.0)
    assert why is not None and "refused" in why.lower()
