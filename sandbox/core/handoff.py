"""Calls between the caller's event loop and the pool's private one, one wake-up per batch.

Why not `asyncio.run_coroutine_threadsafe` + `wrap_future` per call: each crossing writes the
target loop's self-pipe and chains two futures through callbacks on both threads; at a thousand
tool calls a second that was a third of the host's cost per call. Here a crossing appends to a
deque and wakes the target loop only if it is not already due to drain it.
"""
from __future__ import annotations

import asyncio
import collections
import weakref


class Mailbox:
    """Runs callables on `loop` (owned by another thread), in the order they were posted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._scheduled = False

    def post(self, fn, *args) -> None:
        # Append, then test the flag; the drain clears the flag, then empties the deque: so an
        # item is either seen by a drain already running or schedules a new one.
        self._items.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # that loop is closed: nobody is left to receive the items
                self._items.clear()

    def _drain(self) -> None:
        self._scheduled = False
        items = self._items
        while items:
            fn, args = items.popleft()
            fn(*args)


class Bridge:
    """Runs coroutines on the pool's loop for callers on any other loop."""

    def __init__(self, pool_loop: asyncio.AbstractEventLoop) -> None:
        self._pool_loop = pool_loop
        self._inbox = Mailbox(pool_loop)
        self._outboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # caller loop -> Mailbox

    async def call(self, make_coro, *args):
        """`await make_coro(*args)` on the pool's loop; cancelling the caller cancels it there."""
        caller = asyncio.get_running_loop()
        done = caller.create_future()
        holder: list = []
        self._inbox.post(self._begin, make_coro, args, caller, done, holder)
        try:
            return await done
        except asyncio.CancelledError:
            self._inbox.post(_cancel, holder)
            raise

    def _begin(self, make_coro, args, caller, done, holder) -> None:  # on the pool's loop
        task = self._pool_loop.create_task(make_coro(*args))
        holder.append(task)
        outbox = self._outboxes.get(caller)
        if outbox is None:
            outbox = self._outboxes[caller] = Mailbox(caller)
        task.add_done_callback(lambda t: outbox.post(_settle, done, t))


def _cancel(holder: list) -> None:
    if holder:
        holder[0].cancel()


def _settle(done: asyncio.Future, task: asyncio.Task) -> None:  # on the caller's loop
    if done.done():
        return
    if task.cancelled():
        done.cancel()
    elif task.exception() is not None:
        done.set_exception(task.exception())
    else:
        done.set_result(task.result())
