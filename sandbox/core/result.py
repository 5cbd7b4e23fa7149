"""The outcome of one sandboxed call.

Every outcome of user code, including crashes of our own machinery, is a RunResult: callers
(the RL rollout loop) never need try/except around a tool call.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from sandbox.inside.frames import REASONS  # one list: the wire format sends reasons by position

# RunResult.reason -> the reason the code-judge service reports (its ResultReason values, in
# sandbox/service/codejudge.py). Plain failures (an exception, a memory or output limit) are reason
# "" with run_success False, as code-judge reports a non-zero exit. Here, below the service, because
# the release's tool text ("reason: ..." in rstar2_cli/protocol/responses.py) says the same words
# without any HTTP in between.
CODEJUDGE_REASONS = {
    "ok": "",
    "runtime_error": "",
    "memory": "",
    "output_limit": "",
    "timeout": "worker_timeout",
    "internal_error": "internal_error",
}


def codejudge_reason(reason: str) -> str:
    """code-judge's reason text for a RunResult.reason (what its client prints after "reason: ")."""
    return CODEJUDGE_REASONS.get(reason, "internal_error")


@dataclass
class RunResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed before exit
    wall_time: float  # seconds
    reason: str  # one of REASONS

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"RunResult.reason: {self.reason!r} is not one of {', '.join(REASONS)}")

    @property
    def ok(self) -> bool:
        return self.reason == "ok"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunResult:
        return cls(**{k: data[k] for k in ("stdout", "stderr", "exit_code", "wall_time", "reason")})

    @classmethod
    def internal_error(cls, message: str, wall_time: float = 0.0) -> RunResult:
        return cls(stdout="", stderr=f"Sandbox internal error: {message}", exit_code=None,
                   wall_time=wall_time, reason="internal_error")
