"""rstar2's code sandbox. Stands alone: imports nothing from rstar2_cli.

Public API: ``from sandbox import Sandbox, RunResult, Limits, SandboxUnavailable``. The names are
resolved lazily so the jailed zygote, which imports ``sandbox.zygote``, does not pay for asyncio
and the host-side pool.
"""
from __future__ import annotations

__all__ = ["Sandbox", "RunResult", "Limits", "SandboxUnavailable"]


def __getattr__(name: str):
    if name == "Sandbox":
        from sandbox.api import Sandbox
        return Sandbox
    if name == "RunResult":
        from sandbox.result import RunResult
        return RunResult
    if name == "Limits":
        from sandbox.limits import Limits
        return Limits
    if name == "SandboxUnavailable":
        from sandbox.jail import SandboxUnavailable
        return SandboxUnavailable
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
