"""The sandbox that a rollout's tool calls run in, built one way for `rstar2 rl` and `rstar2 eval`.

Why one factory: an eval score has to measure the same thing as the training reward, so a snippet
runs with the same limits in both: wall and CPU time `rollout.tool_timeout` (release: code-judge
MAX_EXECUTION_TIME=4), `sandbox.memory_mb` of address space, and the same prelude (the runner
that wraps every call, `protocol/code_runner.py`). With a URL, both use the remote service
(`rstar2 serve-sandbox`), whose own limits then apply. `rl_tool_sandbox` and `eval_tool_sandbox`
read the values from each caller's settings; eval has no sandbox section, so it takes
`SandboxConfig`'s defaults, which are the recipes' values too.
"""
from __future__ import annotations

from rstar2_cli.config import RecipeConfig, RolloutConfig, SandboxConfig
from rstar2_cli.protocol.code_runner import RUNNER_PRELUDE
from sandbox import Limits, Sandbox
from sandbox.service.client import RemoteSandbox


def tool_sandbox(url: str | None, *, tool_timeout: float, memory_mb: int, workers: int | None = None,
                 isolation: str = "auto"):
    """A `RemoteSandbox(url)`, or without a URL an embedded pool (not started) whose calls get
    `tool_timeout` seconds of wall and CPU time and `memory_mb`."""
    if url:
        return RemoteSandbox(url)
    return Sandbox(workers=workers, isolation=isolation,
                   limits=Limits(timeout=tool_timeout, cpu_time=tool_timeout, memory_mb=memory_mb),
                   preludes=(RUNNER_PRELUDE,))


def rl_tool_sandbox(cfg: RecipeConfig):
    """The RL run's sandbox: `sandbox.url`, or the embedded pool sized by the recipe's `sandbox`."""
    sb = cfg.sandbox
    return tool_sandbox(sb.url, tool_timeout=cfg.rollout.tool_timeout, memory_mb=sb.memory_mb,
                        workers=sb.workers, isolation=sb.isolation)


def eval_tool_sandbox(url: str | None, rollout: RolloutConfig):
    """An evaluation's sandbox: `--sandbox-url`, or the embedded pool with RL's defaults."""
    sb = SandboxConfig()
    return tool_sandbox(url, tool_timeout=rollout.tool_timeout, memory_mb=sb.memory_mb,
                        workers=sb.workers, isolation=sb.isolation)
