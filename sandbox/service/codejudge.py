"""code-judge's wire format, so rStar2-Agent's tool config talks to our service unchanged.

microsoft/rStar's `code_judge_utils.call_long_batch` posts `{"type": "batch", "submissions": [...]}`
to `/run/long-batch` and reads `results[i]["run_success"]`, `["success"]`, `["stdout"]`,
`["stderr"]`, `["cost"]` and `["reason"]`; it retries only the `"queue_timeout"` ones. These
models copy 0xWJ/code-judge's `Submission`/`SubmissionResult` shapes and the rule it uses for
`success` (exit 0, and stripped stdout equals stripped `expected_output` when one is given).
Per-item problems (an unsupported `type`, an oversize `solution`) come back as results with
reason `"invalid_input"` so one bad item never fails a whole batch.
"""
from __future__ import annotations

import uuid
from enum import Enum

from pydantic import BaseModel, Field

from sandbox.core.result import RunResult, codejudge_reason


class ResultReason(str, Enum):
    NONE = ""
    INTERNAL_ERROR = "internal_error"
    WORKER_TIMEOUT = "worker_timeout"
    QUEUE_TIMEOUT = "queue_timeout"
    INVALID_INPUT = "invalid_input"


SUPPORTED_TYPES = ("python",)


class Submission(BaseModel):
    sub_id: str | None = None
    type: str = Field(..., description="language; only 'python' is run here")
    solution: str
    input: str | None = None
    expected_output: str | None = None
    options: dict[str, str] | None = None
    # rstar2 extension (ignored by code-judge clients): a persistent interpreter session id.
    session: str | None = None

    def model_post_init(self, __context) -> None:
        self.sub_id = self.sub_id or str(uuid.uuid4())


class BatchSubmission(BaseModel):
    sub_id: str | None = None
    type: str = "batch"
    submissions: list[Submission] = Field(..., min_length=1)

    def model_post_init(self, __context) -> None:
        self.sub_id = self.sub_id or str(uuid.uuid4())


class SubmissionResult(BaseModel):
    sub_id: str
    success: bool
    run_success: bool
    cost: float
    stdout: str | None = None
    stderr: str | None = None
    reason: ResultReason = ResultReason.NONE


class BatchSubmissionResult(BaseModel):
    sub_id: str
    results: list[SubmissionResult]


def outputs_match(stdout: str, expected: str) -> bool:
    """code-judge's comparison: surrounding whitespace is ignored."""
    return stdout.strip() == expected.strip()


def to_submission_result(sub: Submission, res: RunResult) -> SubmissionResult:
    run_success = res.reason == "ok"
    success = run_success
    if sub.expected_output is not None:
        success = success and outputs_match(res.stdout, sub.expected_output)
    return SubmissionResult(
        sub_id=sub.sub_id,
        success=success,
        run_success=run_success,
        cost=res.wall_time,
        stdout=res.stdout,
        stderr=res.stderr,
        reason=ResultReason(codejudge_reason(res.reason)),
    )


def error_result(sub: Submission, reason: ResultReason, message: str, cost: float = 0.0) -> SubmissionResult:
    """A result for a call that did not run (or did not finish) for a service-side reason."""
    return SubmissionResult(
        sub_id=sub.sub_id, success=False, run_success=False, cost=cost, stdout="", stderr=message, reason=reason
    )


def to_run_result(result: dict) -> RunResult:
    """The inverse mapping, for RemoteSandbox: a code-judge result dict -> core RunResult."""
    reason = result.get("reason") or ""
    stdout = result.get("stdout") or ""
    stderr = result.get("stderr") or ""
    if result.get("run_success"):
        core_reason = "ok"
    elif reason == ResultReason.WORKER_TIMEOUT.value:
        core_reason = "timeout"
    elif reason in ("", None):
        core_reason = "runtime_error"
    else:  # internal_error, queue_timeout, invalid_input: the code did not run to completion here
        core_reason = "internal_error"
        stderr = stderr or f"sandbox service: {reason}"
    return RunResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=0 if core_reason == "ok" else (1 if core_reason == "runtime_error" else None),
        wall_time=float(result.get("cost") or 0.0),
        reason=core_reason,
    )


class QueueTimeout(RuntimeError):
    """Raised by a backend when no worker took or finished a call in time (-> "queue_timeout")."""
