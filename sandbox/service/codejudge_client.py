"""A client that talks to a code-judge server the way rStar2-Agent's release does.

Why it exists: `rstar2 serve-sandbox` is meant as a drop-in for code-judge, and the release's
client (microsoft/rStar `rstar2_agent/tools/code_judge_utils.py`) does not send the model's code
as is. It sends a stdlib-only executor script with the code base64-encoded inside it, posts
batches to `/run/long-batch`, and resends only the calls answered `queue_timeout`. Tests and
`rstar2 bench-tools --client codejudge` use this module to see the server as that client does.
The executor script itself is `sandbox.service.executor_template.wrap_code` (written there from the
release's documented behaviour, not copied from it).
"""
from __future__ import annotations

import asyncio

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sandbox.service.executor_template import wrap_code


def submission(code: str, stdin: str | None = None, history: list[str] | tuple[str, ...] = ()) -> dict:
    """One submission as the release's client builds it (`python_code_with_standard_io` carries stdin)."""
    return {"type": "python", "solution": wrap_code(code, history), "input": stdin}


async def _post_json(client, url: str, body: dict) -> dict:
    """POST `body` as JSON with an httpx.AsyncClient or an aiohttp.ClientSession (the release's
    client library: `bench-tools --client codejudge` uses it when installed); the answer's JSON."""
    if isinstance(client, httpx.AsyncClient):
        resp = await client.post(url, json=body)
        resp.raise_for_status()
        return resp.json()
    async with client.post(url, json=body) as resp:
        resp.raise_for_status()
        return await resp.json()


def _transport_errors() -> tuple[type[BaseException], ...]:
    errors: tuple[type[BaseException], ...] = (httpx.HTTPError, OSError, asyncio.TimeoutError, ValueError, KeyError)
    try:
        import aiohttp
    except ImportError:
        return errors
    return (*errors, aiohttp.ClientError)


class _QueueTimeouts(Exception):
    """Some submissions of this attempt were answered `queue_timeout`: resend those."""


async def call_long_batch(client, url: str, submissions: list[dict], max_retries: int = 4,
                          backoff: float = 0.5, sleep_after_every_attempt: bool = False) -> list[dict | None]:
    """POST `submissions` to `url` (…/run/long-batch) and resend only those answered
    `queue_timeout`, up to `max_retries` attempts in all, as the release's `call_long_batch` does.
    Returns one result dict per submission (None where every attempt failed). `client` is an
    httpx.AsyncClient or an aiohttp.ClientSession.

    A failed attempt (a transport error, or queue timeouts left) is followed by a sleep of
    `backoff * 2**(attempt-1)` seconds (tenacity's `wait_exponential`), the last one included, as
    in the release. The release also sleeps so after a successful attempt; that is client-side
    latency the server cannot change, so it is off unless asked for (`sleep_after_every_attempt`).
    """
    results: list[dict | None] = [None] * len(submissions)
    todo = list(range(len(submissions)))
    if not todo or max_retries < 1:
        return results
    wait = wait_exponential(multiplier=backoff)
    retrying = AsyncRetrying(stop=stop_after_attempt(max_retries), wait=wait,
                             retry=retry_if_exception_type((*_transport_errors(), _QueueTimeouts)),
                             retry_error_callback=lambda state: None)   # out of attempts: keep the Nones
    async for attempt in retrying:
        with attempt:
            answered = (await _post_json(client, url, {"type": "batch",
                                                       "submissions": [submissions[i] for i in todo]}))["results"]
            retry = []
            for i, result in zip(todo, answered):
                if result["reason"] == "queue_timeout":
                    retry.append(i)
                else:
                    results[i] = result
            todo = retry
            if todo:
                raise _QueueTimeouts(f"{len(todo)} submission(s) answered queue_timeout")
        state = attempt.retry_state   # tenacity sleeps only between attempts: the release's other sleeps
        if (state.outcome.failed and state.attempt_number == max_retries) or (
                sleep_after_every_attempt and not state.outcome.failed):
            await asyncio.sleep(wait(state))
    return results


def tool_response(result: dict) -> str:
    """The text the release's client makes of one result (what the model reads)."""
    good = result["run_success"] and result["success"]
    parts = ["Tool call success" if good else "Tool call failure"]
    if not good:
        parts.append(f"reason: {result['reason']}")
    if result["stdout"]:
        parts.append(f"stdout: {result['stdout']}")
    if result["stderr"]:
        parts.append(f"stderr: {result['stderr']}")
    parts.append(f"execution time: {result['cost']:.2f}s")
    return "\n".join(parts)
