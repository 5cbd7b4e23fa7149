"""rstar2's code sandbox. Stands alone: imports nothing from rstar2_cli.

Public API: ``from sandbox import Sandbox, RunResult, Limits, SandboxUnavailable``. The names are
resolved lazily so the jailed zygote, which imports ``sandbox.inside.zygote``, does not pay for
asyncio and the host-side pool.

Sub-packages, each importing only those before it:
  * ``sandbox.inside``     -- what runs in the jail: the zygote, its children, their pipe frames;
  * ``sandbox.jail``       -- the isolation backends and the probe of what they enforce;
  * ``sandbox.core``       -- the embedded pool (``Sandbox``) and what it is made of;
  * ``sandbox.service``    -- the code-judge HTTP service, its client and the release's template;
  * ``sandbox.redis_mode`` -- the Redis queue between HTTP front ends and worker hosts.
"""
from __future__ import annotations

__all__ = ["Sandbox", "RunResult", "Limits", "SandboxUnavailable"]


def __getattr__(name: str):
    if name == "Sandbox":
        from sandbox.core.pool import Sandbox  # lazy: the zygote imports `sandbox` (module doc)
        return Sandbox
    if name == "RunResult":
        from sandbox.core.result import RunResult  # lazy: the zygote imports `sandbox` (module doc)
        return RunResult
    if name == "Limits":
        from sandbox.core.limits import Limits  # lazy: the zygote imports `sandbox` (module doc)
        return Limits
    if name == "SandboxUnavailable":
        from sandbox.jail.backends import SandboxUnavailable  # lazy: the zygote imports `sandbox` (module doc)
        return SandboxUnavailable
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
