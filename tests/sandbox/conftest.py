"""One shared sandbox pool for the sandbox tests: starting it preloads sympy (~1-2 s)."""
from __future__ import annotations

import asyncio
import os

import pytest

from sandbox import Limits, Sandbox
from sandbox.jail import backends
from sandbox.service.executor_template import CODEJUDGE_PRELUDES

from host_secret import HOST_SECRET_NAME, HOST_SECRET_VALUE


def _started_pool(isolation: str = "auto", **kwargs):
    """A started Sandbox (1 heavy + 1 light zygote) with a host secret it must not see; closed after.
    It knows the code-judge executor templates, as the service's pools do."""
    os.environ[HOST_SECRET_NAME] = HOST_SECRET_VALUE  # must be invisible inside the sandbox
    pool = Sandbox(workers=1, isolation=isolation, preludes=CODEJUDGE_PRELUDES,
                   limits=Limits(timeout=5.0, cpu_time=5.0, memory_mb=512, max_output_bytes=65536), **kwargs)
    pool.run_sync("pass")
    yield pool
    asyncio.run(pool.close())


@pytest.fixture(scope="session")
def sandbox_pool():
    """The pool on the default backend; usable from any test's event loop."""
    yield from _started_pool()


def _jail_param(backend: str, problem):
    reason = f"{backend} unavailable here: {problem}" if problem else ""
    return pytest.param(backend, id=backend, marks=pytest.mark.skipif(problem is not None, reason=reason))


@pytest.fixture(scope="session", params=[_jail_param("nsjail", backends.nsjail_problem()),
                                         _jail_param("bwrap", backends.bwrap_problem())])
def jailed_pool(request):
    """The same pool once per jail backend: the isolation and limit tests run on every backend
    this machine has (auto picks only the first)."""
    yield from _started_pool(request.param)


@pytest.fixture(scope="session")
def unconfined_pool():
    """A pool with no jail at all (stdlib preload only: it starts fast): the positive control of
    the isolation tests, showing that what a jailed call must not reach is reachable here."""
    yield from _started_pool("none", unsafe_no_isolation=True, preload=("math",))
