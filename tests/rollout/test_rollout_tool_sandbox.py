"""One tool sandbox for RL and eval: a snippet runs under the same limits and runner prelude in
`rstar2 eval` as in the RL run it evaluates, and a URL means the remote service in both."""
from __future__ import annotations

from rstar2_cli.config import RolloutConfig, load_recipe
from rstar2_cli.protocol.code_runner import RUNNER_PRELUDE
from rstar2_cli.rollout.tool_sandbox import eval_tool_sandbox, rl_tool_sandbox
from sandbox import Limits
from sandbox.core.preludes import PreludeDigest
from sandbox.service.client import RemoteSandbox


def test_rl_and_eval_run_a_snippet_under_the_same_limits_and_prelude():
    rl = rl_tool_sandbox(load_recipe(None, ["rollout.tool_timeout=3.0"]))
    ev = eval_tool_sandbox(None, RolloutConfig(tool_timeout=3.0))
    assert rl.limits == ev.limits == Limits(timeout=3.0, cpu_time=3.0, memory_mb=1024)
    assert (rl.isolation, rl.n_workers) == (ev.isolation, ev.n_workers)
    assert list(rl.preludes) == list(ev.preludes) == [PreludeDigest.of(RUNNER_PRELUDE)]


def test_the_recipe_sizes_the_rl_pool_and_a_url_means_the_remote_service():
    rl = rl_tool_sandbox(load_recipe(None, ["sandbox.memory_mb=2048", "sandbox.workers=3"]))
    assert (rl.limits.memory_mb, rl.n_workers) == (2048, 3)
    remote = rl_tool_sandbox(load_recipe(None, ["sandbox.url=http://head:8088"]))
    assert isinstance(remote, RemoteSandbox) and remote.url == "http://head:8088"
    remote = eval_tool_sandbox("http://head:8088", RolloutConfig())
    assert isinstance(remote, RemoteSandbox) and remote.url == "http://head:8088"
