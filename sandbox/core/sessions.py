"""Notebook-style sessions by HISTORY REPLAY.

Choice: every call runs in a fresh child forked from the clean zygote, so there is no long-lived
interpreter to keep a session's variables in. Instead we remember the session's successful cells
and, on the next call, re-execute them (output suppressed) before the new cell, in the same child.
This keeps the "nothing leaks between calls" guarantee, survives worker restarts, and lets any
worker serve any session.

Costs and caveats (by design, documented for users):
  * replay re-executes code: side effects happen again (files are re-written in the fresh scratch
    dir, which is fine) and randomness is re-drawn unless the cell seeded it -- a cell that used
    `random.random()` may see a different value on replay than the model saw. Replay failures are
    reported as a runtime_error naming the problem.
  * replay time counts against the call's timeout; histories are capped (MAX_CELLS / MAX_CHARS).
  * only cells that ended "ok" are recorded, as a notebook user would re-run the good cells.
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict

MAX_SESSIONS = 4096
MAX_CELLS = 200
MAX_CHARS = 1_000_000


class SessionFull(Exception):
    """The session's history hit MAX_CELLS/MAX_CHARS."""


class SessionStore:
    def __init__(self) -> None:
        self._history: OrderedDict[str, list[list]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._mutex = threading.Lock()  # close_session may come from another thread

    def history(self, name: str) -> list[list]:
        with self._mutex:
            cells = self._history.get(name, [])
            if name in self._history:
                self._history.move_to_end(name)
            if len(cells) >= MAX_CELLS or sum(len(c[0]) for c in cells) >= MAX_CHARS:
                raise SessionFull(f"session {name!r} reached its history limit ({MAX_CELLS} cells or "
                                  f"{MAX_CHARS} characters); start a new session")
            return list(cells)

    def record(self, name: str, code: str, stdin: str | None) -> None:
        with self._mutex:
            self._history.setdefault(name, []).append([code, stdin])
            self._history.move_to_end(name)
            while len(self._history) > MAX_SESSIONS:
                old, _ = self._history.popitem(last=False)
                self._locks.pop(old, None)

    def lock(self, name: str) -> asyncio.Lock:
        """Cells of one session run one after another (call from the pool's event loop)."""
        with self._mutex:
            return self._locks.setdefault(name, asyncio.Lock())

    def close(self, name: str) -> None:
        with self._mutex:
            self._history.pop(name, None)
            self._locks.pop(name, None)

    def __len__(self) -> int:
        return len(self._history)
