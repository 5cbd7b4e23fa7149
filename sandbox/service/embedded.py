"""The embedded pool a service runs calls on, built from plain (JSON-able) kwargs.

Why a preflight on top of the core's own gate: a service accepts code from anyone who can reach
its port, so it must refuse to come up unconfined (unless the operator passed
`--unsafe-no-isolation`) BEFORE it binds the port or forks workers, with one clear line rather
than a traceback from inside uvicorn's startup. Every pool built here also knows the code-judge
executor templates (`CODEJUDGE_PRELUDES`), on top of the preludes its caller passes.
"""
from __future__ import annotations

from sandbox.core.limits import Limits
from sandbox.core.pool import DEFAULT_PRELOAD, Sandbox
from sandbox.jail.backends import plan
from sandbox.service.executor_template import CODEJUDGE_PRELUDES


def preflight(sandbox_kwargs: dict) -> str:
    """The isolation backend these kwargs get, without starting a pool; raises SandboxUnavailable
    (one line, naming what is missing) when isolation is unavailable and not explicitly waived, or
    the jail could not show what the zygotes import."""
    return plan(sandbox_kwargs.get("isolation", "auto"), bool(sandbox_kwargs.get("unsafe_no_isolation")),
                sandbox_kwargs.get("workers") or 1, None, tuple(sandbox_kwargs.get("preload", DEFAULT_PRELOAD))).backend


def build_sandbox(sandbox_kwargs: dict) -> Sandbox:
    """A core Sandbox from plain kwargs (limits as a dict), after the isolation preflight."""
    preflight(sandbox_kwargs)
    return sandbox_from_kwargs(sandbox_kwargs)


def sandbox_from_kwargs(sandbox_kwargs: dict) -> Sandbox:
    """A core Sandbox from plain (JSON-able) kwargs: `limits` may be a dict of Limits fields,
    `preludes` a list of prelude texts (the code-judge ones are always added)."""
    kwargs = dict(sandbox_kwargs)
    if kwargs.get("limits") is not None:
        kwargs["limits"] = Limits(**kwargs["limits"])
    kwargs["preludes"] = (*CODEJUDGE_PRELUDES, *kwargs.get("preludes", ()))
    return Sandbox(**kwargs)
