"""The sandbox HTTP service: code-judge's API in front of an embedded Sandbox or a Redis queue.

Why a bounded admission gate instead of an unbounded task pile: under RL rollouts thousands of
tool calls can arrive at once; queuing them all in memory hides overload until latency explodes.
Here at most `max_queue` calls are admitted; `/run` and `/run/batch` answer 429 beyond that, and
`/run/long-batch` (the one rStar2-Agent uses) waits for room, up to `long_batch_wait` seconds,
and then reports `queue_timeout` for the calls it could not place (rStar's client retries those).
No call is ever dropped without a result, and no snippet or backend fault becomes a 500.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from sandbox.service.codejudge import (
    SUPPORTED_TYPES,
    BatchSubmission,
    BatchSubmissionResult,
    QueueTimeout,
    ResultReason,
    Submission,
    SubmissionResult,
    error_result,
    to_submission_result,
)
from sandbox.core.result import RunResult

log = logging.getLogger(__name__)


class Backend(Protocol):
    """What the service runs calls on: the embedded `Sandbox` or the Redis `RedisFrontend`."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def run(self, code: str, stdin: str | None = None, timeout: float | None = None,
                  session: str | None = None) -> RunResult: ...
    def close_session(self, session: str) -> None: ...
    def stats(self) -> dict: ...
    def protections(self) -> dict: ...


@dataclass
class ServiceConfig:
    max_queue: int = 512                 # calls admitted at once (running + waiting for a worker)
    max_batch: int = 4096                # submissions per batch request
    max_body_bytes: int = 32 * 1024 * 1024
    max_solution_bytes: int = 1024 * 1024
    long_batch_wait: float = 600.0       # seconds a long-batch call may wait for room
    timeout: float | None = None         # per-call wall timeout; None: the backend's Limits
    max_timeout: float = 300.0           # the most a submission may ask for via options.timeout

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_batch", "max_body_bytes", "max_solution_bytes", "long_batch_wait",
                     "max_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ServiceConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"ServiceConfig.timeout must be > 0, got {self.timeout!r}")


class AdmissionGate:
    """A counting gate over admitted calls: non-blocking for /run(/batch), waiting for long-batch."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.in_flight = 0
        self.waiting = 0
        self._cond = asyncio.Condition()

    def try_acquire(self, n: int = 1) -> bool:
        if self.in_flight + n > self.capacity:
            return False
        self.in_flight += n
        return True

    async def acquire(self, deadline: float) -> bool:
        """Wait for one slot until `deadline` (time.monotonic); False when it passed."""
        if self.waiting == 0 and self.try_acquire(1):
            return True
        self.waiting += 1
        try:
            async with self._cond:
                while not self.try_acquire(1):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    try:
                        await asyncio.wait_for(self._cond.wait(), left)
                    except asyncio.TimeoutError:
                        pass
                return True
        finally:
            self.waiting -= 1

    async def release(self, n: int = 1) -> None:
        self.in_flight -= n
        async with self._cond:
            self._cond.notify(n)


class _BodyLimit:
    """ASGI middleware: reject bodies over `max_bytes` with 413 before anything parses them."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(scope, receive, send, int(declared))
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await self._reject(scope, receive, send, size)
            chunks.append(body)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send, size: int):
        detail = f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes"
        await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


class SessionClose(BaseModel):
    session: str


class SandboxService:
    """Turns code-judge submissions into backend calls, under the admission gate."""

    def __init__(self, backend: Backend, config: ServiceConfig):
        self.backend, self.config = backend, config
        self.gate = AdmissionGate(config.max_queue)
        self.counters = {"received": 0, "completed": 0, "rejected": 0, "queue_timeout": 0,
                         "internal_error": 0, "invalid_input": 0}

    def _timeout(self, sub: Submission) -> float | None:
        """Per-call timeout: `options.timeout` (rstar2 extension, seconds) or the service default."""
        raw = (sub.options or {}).get("timeout")
        if raw is None:
            return self.config.timeout
        value = float(raw)  # ValueError -> invalid_input
        if not 0 < value <= self.config.max_timeout:
            raise ValueError(f"options.timeout must be in (0, {self.config.max_timeout}], got {raw!r}")
        return value

    def _invalid(self, sub: Submission) -> SubmissionResult | None:
        """An `invalid_input` result for a submission we will not run, else None."""
        limit = self.config.max_solution_bytes
        if sub.type not in SUPPORTED_TYPES:
            message = f"unsupported submission type {sub.type!r}; this sandbox runs {list(SUPPORTED_TYPES)}"
        elif len(sub.solution.encode()) > limit:
            message = f"solution of {len(sub.solution.encode())} bytes exceeds {limit} bytes"
        elif sub.input is not None and len(sub.input.encode()) > limit:
            message = f"input of {len(sub.input.encode())} bytes exceeds {limit} bytes"
        else:
            try:
                self._timeout(sub)
                return None
            except ValueError as e:
                message = f"options.timeout: {e}"
        return error_result(sub, ResultReason.INVALID_INPUT, message)

    def _count(self, result: SubmissionResult) -> SubmissionResult:
        self.counters["completed"] += 1
        if result.reason.value in self.counters:
            self.counters[result.reason.value] += 1
        return result

    async def _execute(self, sub: Submission) -> SubmissionResult:
        """Run one admitted submission; the caller holds its gate slot."""
        start = time.monotonic()
        try:
            res = await self.backend.run(sub.solution, stdin=sub.input, timeout=self._timeout(sub),
                                         session=sub.session)
            return to_submission_result(sub, res)
        except QueueTimeout as e:
            return error_result(sub, ResultReason.QUEUE_TIMEOUT, str(e), time.monotonic() - start)
        except Exception as e:  # a backend fault is this call's error, never the server's
            log.exception("backend failed on submission %s", sub.sub_id)
            return error_result(sub, ResultReason.INTERNAL_ERROR, f"sandbox backend error: {e!r}",
                                time.monotonic() - start)

    async def run_admitted(self, subs: list[Submission]) -> list[SubmissionResult]:
        """All-or-nothing admission (for /run and /run/batch): 429 when the gate has no room."""
        self.counters["received"] += len(subs)
        invalid = [self._invalid(s) for s in subs]
        todo = [s for s, bad in zip(subs, invalid) if bad is None]
        if len(todo) > self.config.max_queue:
            self.counters["rejected"] += len(subs)
            raise HTTPException(413, f"batch of {len(todo)} calls exceeds the queue capacity of "
                                     f"{self.config.max_queue}; split it or use /run/long-batch")
        if not self.gate.try_acquire(len(todo)):
            self.counters["rejected"] += len(subs)
            raise HTTPException(429, f"sandbox queue is full ({self.gate.in_flight}/{self.config.max_queue} "
                                     "calls in flight); retry later or use /run/long-batch",
                                headers={"Retry-After": "1"})
        try:
            ran = iter(await asyncio.gather(*(self._execute(s) for s in todo)))
        finally:
            await self.gate.release(len(todo))
        return [self._count(bad if bad is not None else next(ran)) for bad in invalid]

    async def run_waiting(self, subs: list[Submission]) -> list[SubmissionResult]:
        """Per-call admission that waits for room (for /run/long-batch)."""
        self.counters["received"] += len(subs)
        deadline = time.monotonic() + self.config.long_batch_wait

        async def one(sub: Submission) -> SubmissionResult:
            bad = self._invalid(sub)
            if bad is not None:
                return bad
            if not await self.gate.acquire(deadline):
                return error_result(sub, ResultReason.QUEUE_TIMEOUT, "sandbox queue stayed full for "
                                    f"{self.config.long_batch_wait:.0f}s; retry later", self.config.long_batch_wait)
            try:
                return await self._execute(sub)
            finally:
                await self.gate.release(1)

        return [self._count(r) for r in await asyncio.gather(*(one(s) for s in subs))]

    def status(self) -> dict[str, Any]:
        try:
            backend = self.backend.stats()
        except Exception as e:  # status must answer even when the backend is sick
            backend = {"error": repr(e)}
        return {
            "queue": self.gate.waiting + int(backend.get("queued", 0) or 0),
            "in_flight": self.gate.in_flight,
            "capacity": self.config.max_queue,
            "num_workers": backend.get("workers", 0),
            "counters": dict(self.counters),
            "backend": backend,
        }


def _one_line(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def create_app(backend: Backend, config: ServiceConfig | None = None) -> FastAPI:
    """The FastAPI app; it starts the backend on startup and closes it on shutdown."""
    service = SandboxService(backend, config or ServiceConfig())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await backend.start()
        try:
            yield
        finally:
            await backend.close()

    app = FastAPI(title="rstar2 sandbox (code-judge API)", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _one_line(exc)}, status_code=422)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.post("/run", response_model=SubmissionResult)
    async def run(sub: Submission):
        return (await service.run_admitted([sub]))[0]

    def check_batch(batch: BatchSubmission) -> None:
        if batch.type != "batch":
            raise HTTPException(422, f"invalid request: type must be 'batch', got {batch.type!r}")
        if len(batch.submissions) > service.config.max_batch:
            raise HTTPException(413, f"batch of {len(batch.submissions)} submissions exceeds the limit "
                                     f"of {service.config.max_batch}")

    async def read_batch(request: Request) -> BatchSubmission:
        """The body parsed and validated in one pass by pydantic's own JSON parser (FastAPI's
        body handling json.loads the body, then validates the Python objects)."""
        try:
            batch = BatchSubmission.model_validate_json(await request.body())
        except ValidationError as e:
            raise RequestValidationError([{**err, "loc": ("body", *err.get("loc", ()))} for err in e.errors()])
        check_batch(batch)
        return batch

    def answer(batch: BatchSubmission, results: list[SubmissionResult]) -> Response:
        """Serialised straight by pydantic; a `response_model` would validate the results again first."""
        body = BatchSubmissionResult(sub_id=batch.sub_id, results=results).model_dump_json()
        return Response(body, media_type="application/json")

    # Why batch bodies are read by hand: at concurrency 64 the front end's JSON handling and
    # validation compete with the pool for the same interpreter; one pydantic pass each way
    # instead of FastAPI's two halves that cost (see docs/sandbox.md, "HTTP path").
    @app.post("/run/batch", response_model=BatchSubmissionResult)
    async def run_batch(request: Request):
        batch = await read_batch(request)
        return answer(batch, await service.run_admitted(batch.submissions))

    @app.post("/run/long-batch", response_model=BatchSubmissionResult)
    async def run_long_batch(request: Request):
        batch = await read_batch(request)
        return answer(batch, await service.run_waiting(batch.submissions))

    @app.post("/session/close")
    async def close_session(req: SessionClose) -> dict:
        backend.close_session(req.session)
        return {"closed": req.session}

    @app.get("/status")
    def status() -> dict:
        return service.status()

    @app.get("/protections")
    def protections() -> dict:
        return backend.protections()

    app.add_middleware(_BodyLimit, max_bytes=service.config.max_body_bytes)
    return app


def serve(backend: Backend, config: ServiceConfig, host: str = "127.0.0.1", port: int = 8088,
          log_level: str = "warning", loop: str = "auto") -> None:
    """Serve until interrupted (blocking). `loop`: uvicorn's event loop ("auto" picks uvloop)."""
    import uvicorn

    uvicorn.run(create_app(backend, config), host=host, port=port, log_level=log_level,
                lifespan="on", timeout_keep_alive=30, loop=loop)
