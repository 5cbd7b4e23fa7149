"""vLLM's log lines go to the run folder's logs/ (this process's and every engine process's, through
the LoggingConfig vLLM builds from VLLM_LOGGING_CONFIG_PATH and applies in the engine core), errors
still reach stderr, and --verbose or a user's own logging config keeps them where they were. Each
case runs in a fresh process: logging is process-wide."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow     # four processes that import vLLM

# What happens in a trainer that starts an engine: route, then build the engine's config inside
# engine_spawn_env (vLLM's VllmConfig reads its LoggingConfig from the environment there); the engine
# process applies that config (vllm/v1/engine/core.py `run_engine_core`), and so does the client side
# in the trainer (AsyncLLM -> configure_logging_if_needed). The environment keeps no trace after.
SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, warnings
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed, init_logger
    from rstar2_cli.rollout.engine_env import engine_spawn_env
    from rstar2_cli.rollout.engine_logs import route_engine_logs
    print("routed", route_engine_logs(sys.argv[1], rank=3))
    with engine_spawn_env(sleep_mode=False):
        config = LoggingConfig()
    print("left in the environment:", os.environ.get("VLLM_LOGGING_CONFIG_PATH"))
    engine = ("import sys; from vllm.config.logging import LoggingConfig; from vllm.logger import configure_logging,"
              " init_logger; configure_logging(LoggingConfig(pylogging_config_file=sys.argv[1] or None));"
              " log = init_logger('vllm.v1.engine.core'); log.info('engine core ready');"
              " log.error('engine core trouble')")
    subprocess.run([sys.executable, "-c", engine, config.pylogging_config_file or ""], check=True)
    configure_logging_if_needed(config)
    init_logger("vllm.v1.engine.async_llm").info("client started")
    warnings.warn("a library's deprecation", DeprecationWarning)
""")


def run(tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RSTAR2_", "VLLM_LOGGING", "VLLM_CONFIGURE"))}
    return subprocess.run([sys.executable, "-W", "always", "-c", SCRIPT, str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=300, check=True,
                          env={**environ, "PYTHONPATH": str(REPO), "VLLM_LOGGING_LEVEL": "INFO", **env})


def test_engine_and_client_lines_go_to_the_run_folder_and_errors_to_stderr_too(tmp_path):
    out = run(tmp_path)
    log = tmp_path / "run" / "logs" / "vllm_rank3.log"
    assert f"routed {log}" in out.stdout and "left in the environment: None" in out.stdout
    text = log.read_text()
    for line in ("engine core ready", "engine core trouble", "client started", "a library's deprecation"):
        assert line in text, line
    assert "engine core ready" not in out.stdout + out.stderr and "client started" not in out.stdout + out.stderr
    assert "engine core trouble" in out.stderr


def test_verbose_or_a_users_logging_config_leaves_the_lines_where_they_were(tmp_path):
    out = run(tmp_path, RSTAR2_VERBOSE="1")
    assert "routed None" in out.stdout and "client started" in out.stdout + out.stderr
    assert not (tmp_path / "run" / "logs").exists()
    mine = tmp_path / "mine.json"
    mine.write_text('{"version": 1, "disable_existing_loggers": false}')
    out = run(tmp_path, VLLM_LOGGING_CONFIG_PATH=str(mine))
    assert "routed None" in out.stdout and not (tmp_path / "run" / "logs").exists()
