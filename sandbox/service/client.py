"""RemoteSandbox: the embedded Sandbox's async API, served by a remote `rstar2 serve-sandbox`.

Callers (rollout loop, eval, bench) can switch between `Sandbox()` and `RemoteSandbox(url)`
without code changes: both return core `RunResult`s and never raise for bad user code. Calls go
through `/run/long-batch`, which waits for room in the server's queue instead of answering 429;
transport failures (connection refused, a server killed mid-request) and 429/5xx answers are
retried with exponential backoff (tenacity: `backoff * 2**(n-1)` seconds after the n-th failed try,
at most `max_backoff`; the defaults ride out about 25 s, e.g. a `serve-sandbox` restarted on its
port), then become `internal_error` results rather than exceptions.

`outage` (`SandboxOutage`) says how long every request has been failing that way: a trainer aborts
the run once it exceeds `sandbox.outage_s` (`rstar2_cli/rl/run/trainer.py`).

Why calls are coalesced: one HTTP request per tool call makes the client the bottleneck under
high concurrency (httpx's pool costs ~10x more per request at 64 in flight than at 1). Calls made
in the same event-loop tick (plus `batch_window` seconds, default 0) share one long-batch
request of up to `max_batch` submissions, as rStar2-Agent's own RequestProcessor does.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Callable

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sandbox.service.codejudge import to_run_result
from sandbox.core.result import RunResult


class ServerBusy(Exception):
    """A 429 or 5xx answer: the server is there but cannot serve the request now (retried)."""


class SandboxUnreachable(ConnectionError):
    """Every try of one request failed with a transport error or a 429/5xx answer."""


RETRYABLE = (httpx.TransportError, ServerBusy)


class SandboxOutage:
    """How long every request to a remote sandbox has failed as an infrastructure error.

    `failed(start, end)` records one request that failed after its retries (or was answered with
    nothing but `internal_error` results), `succeeded()` one that got any real result. `down_for()`
    is the span from the start of the first failed request of the current run of failures to the
    end of its latest one: time seen failing, not time since (a trainer that spends minutes in its
    update without calling the sandbox does not count those minutes as an outage)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.since: float | None = None
        self.last = 0.0
        self.failures = 0   # failed requests in a row

    def failed(self, start: float, end: float) -> None:
        if self.since is None:
            self.since = start
        self.last, self.failures = max(self.last, end), self.failures + 1

    def succeeded(self) -> None:
        self.since, self.last, self.failures = None, 0.0, 0

    def down_for(self) -> float:
        return 0.0 if self.since is None else self.last - self.since


@dataclass(eq=False)
class _LoopState:
    """What one event loop holds: the HTTP client (its pooled connections are that loop's streams),
    the calls buffered for the next long-batch request, and the requests in flight."""
    client: httpx.AsyncClient
    buffer: list[tuple[dict, asyncio.Future]] = field(default_factory=list)
    flush_pending: bool = False
    background: set[asyncio.Task] = field(default_factory=set)
    closer: AsyncGenerator[None, None] | None = None


class RemoteSandbox:
    def __init__(self, url: str, timeout: float = 600.0, retries: int = 6, backoff: float = 0.5,
                 max_connections: int = 64, max_batch: int = 64, batch_window: float = 0.0,
                 max_backoff: float = 8.0, clock: Callable[[], float] = time.monotonic):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"RemoteSandbox url: expected http(s)://host:port, got {url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0 or max_backoff < 0 or max_batch < 1 or batch_window < 0:
            raise ValueError(f"RemoteSandbox: need timeout > 0, retries >= 0, backoff >= 0, max_backoff >= 0, "
                             f"max_batch >= 1, batch_window >= 0; got {timeout!r}, {retries!r}, {backoff!r}, "
                             f"{max_backoff!r}, {max_batch!r}, {batch_window!r}")
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self.outage = SandboxOutage(clock)
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.max_batch, self.batch_window = max_batch, batch_window
        self._on_loop: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self.requests_sent = 0  # long-batch requests so far (calls are coalesced into them)

    async def start(self) -> None:
        await self._state()

    async def close(self) -> None:
        """Close what the running loop holds (its requests in flight deliver their results first);
        what other loops held was closed when they shut down, or is dropped now if they are closed."""
        state = self._on_loop.get(asyncio.get_running_loop())
        if state is not None:
            await state.closer.aclose()   # runs _LoopState's close on this loop
        self._forget_closed_loops()

    async def __aenter__(self) -> RemoteSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _state(self) -> _LoopState:
        """The running loop's client, buffer and requests in flight, made on first use.

        Why one per loop: httpx's pooled connections are streams of the loop that opened them, and
        one sandbox serves several loops in one RL run (the rollouts on the trainer's loop, each
        held-out evaluation on its own `asyncio.run`, eval/runner.py). A connection reused from
        another loop fails ("... is bound to a different event loop", "Event loop is closed").
        Each state is closed on its own loop: by `close()`, or when `asyncio.run` ends that loop
        (its `shutdown_asyncgens` closes the state's async generator)."""
        loop = asyncio.get_running_loop()
        state = self._on_loop.get(loop)
        if state is None:
            self._forget_closed_loops()
            client = httpx.AsyncClient(base_url=self.url, timeout=self.timeout, limits=self._limits)
            state = self._on_loop[loop] = _LoopState(client)
            state.closer = self._close_at_shutdown(loop, state)
            await state.closer.__anext__()
        return state

    async def _close_at_shutdown(self, loop: asyncio.AbstractEventLoop, state: _LoopState):
        """Suspended until closed (`close()`, or the loop's `shutdown_asyncgens`), then closes `state`."""
        try:
            yield
        finally:
            if self._on_loop.get(loop) is state:
                del self._on_loop[loop]
            if state.background:   # let requests in flight deliver their results first
                await asyncio.gather(*state.background, return_exceptions=True)
            await state.client.aclose()

    def _forget_closed_loops(self) -> None:
        """Drop the state of a loop closed without `shutdown_asyncgens` (a bare `loop.close()`):
        nothing can run on it any more, so its sockets close when the client is collected."""
        for loop in [lp for lp in self._on_loop if lp.is_closed()]:
            del self._on_loop[loop]

    async def _request(self, method: str, path: str, **kwargs) -> httpx.Response:
        client = (await self._state()).client
        retrying = AsyncRetrying(stop=stop_after_attempt(self.retries + 1), reraise=True,
                                 wait=wait_exponential(multiplier=self.backoff, max=self.max_backoff),
                                 retry=retry_if_exception_type(RETRYABLE))
        try:
            async for attempt in retrying:
                with attempt:
                    resp = await client.request(method, path, **kwargs)
                    if resp.status_code == 429 or resp.status_code >= 500:
                        raise ServerBusy(f"{resp.status_code}: {resp.text[:200]}")
        except RETRYABLE as e:
            raise SandboxUnreachable(f"sandbox server {self.url}{path} failed after {self.retries + 1} tries: "
                                     f"{e!r}") from e
        if resp.status_code >= 400:  # our request is wrong: retrying cannot help
            raise ValueError(f"sandbox server rejected {path} ({resp.status_code}): {resp.text[:300]}")
        return resp

    async def run(self, code: str, stdin: str | None = None, timeout: float | None = None,
                  session: str | None = None) -> RunResult:
        return (await self.run_batch([{"code": code, "stdin": stdin, "session": session}], timeout))[0]

    async def run_batch(self, items: list[dict], timeout: float | None = None) -> list[RunResult]:
        if not items:
            return []
        state = await self._state()
        loop = asyncio.get_running_loop()
        options = None if timeout is None else {"timeout": str(timeout)}
        futures = []
        for it in items:
            sub = {"type": "python", "solution": it["code"], "input": it.get("stdin"),
                   "session": it.get("session"), "options": options}
            futures.append(loop.create_future())
            state.buffer.append((sub, futures[-1]))
        if len(state.buffer) >= self.max_batch:
            self._flush(state)
        elif not state.flush_pending:
            state.flush_pending = True
            if self.batch_window:
                loop.call_later(self.batch_window, self._flush, state)
            else:
                loop.call_soon(self._flush, state)
        return list(await asyncio.gather(*futures))

    def _flush(self, state: _LoopState) -> None:
        """Send what is buffered on this loop, `max_batch` submissions per request, without waiting."""
        state.flush_pending = False
        while state.buffer:
            chunk, state.buffer = state.buffer[:self.max_batch], state.buffer[self.max_batch:]
            task = asyncio.get_running_loop().create_task(self._send(chunk))
            state.background.add(task)
            task.add_done_callback(state.background.discard)

    async def _send(self, chunk: list[tuple[dict, asyncio.Future]]) -> None:
        start = self.outage.clock()
        try:
            body = {"type": "batch", "submissions": [sub for sub, _ in chunk]}
            self.requests_sent += 1
            resp = await self._request("POST", "/run/long-batch", json=body)
            results = [to_run_result(r) for r in resp.json()["results"]]
            if len(results) != len(chunk):
                raise ValueError(f"server answered {len(results)} results for {len(chunk)} submissions")
        except Exception as e:  # every waiting caller gets a result, whatever went wrong
            results = [RunResult.internal_error(str(e) or repr(e), self.outage.clock() - start)] * len(chunk)
            if isinstance(e, SandboxUnreachable):
                self.outage.failed(start, self.outage.clock())
        else:   # answered, but with nothing except internal errors (its workers or Redis gone): down too
            if all(r.reason == "internal_error" for r in results):
                self.outage.failed(start, self.outage.clock())
            else:
                self.outage.succeeded()
        for (_, fut), res in zip(chunk, results):
            if not fut.done():
                fut.set_result(res)

    def close_session(self, session: str) -> None:
        """Like Sandbox.close_session (sync): fire-and-forget inside a running event loop."""
        coro = self._request("POST", "/session/close", json={"session": session})
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(coro)
            return
        task = loop.create_task(coro)
        state = self._on_loop.get(loop)
        if state is not None:   # close() waits for it (no state: nothing ran on this loop, nothing to wait for)
            state.background.add(task)
            task.add_done_callback(state.background.discard)

    async def status(self) -> dict:
        """The server's /status: queue depth, counters and the backend's stats."""
        return (await self._request("GET", "/status")).json()

    async def protections(self) -> dict:
        return (await self._request("GET", "/protections")).json()

    def run_sync(self, code: str, stdin: str | None = None, timeout: float | None = None,
                 session: str | None = None) -> RunResult:
        async def once() -> RunResult:
            async with RemoteSandbox(self.url, self.timeout, self.retries, self.backoff,
                                     max_backoff=self.max_backoff) as sb:
                return await sb.run(code, stdin, timeout, session)
        return asyncio.run(once())
