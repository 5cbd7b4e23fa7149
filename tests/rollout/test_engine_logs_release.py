"""A run's log routing ends with the run (`RolloutSide.close` -> `release_engine_logs`): engines
built later in the same process (a test session, the quickstart's next run) get no stale log folder,
and the loggers get back what they had."""
from __future__ import annotations

import logging
import warnings

from rstar2_cli.rollout import engine_logs
from rstar2_cli.rollout.engine_env import engine_spawn_env


def test_routing_lasts_until_released(tmp_path, monkeypatch):
    monkeypatch.delenv(engine_logs.VERBOSE_ENV, raising=False)
    monkeypatch.delenv(engine_logs.VLLM_CONFIG_ENV, raising=False)
    vllm_logger = logging.getLogger("vllm")
    before = (list(vllm_logger.handlers), vllm_logger.propagate, vllm_logger.level, warnings.showwarning)
    log_file = engine_logs.route_engine_logs(tmp_path / "run", rank=1)
    try:
        assert log_file == tmp_path / "run" / "logs" / "vllm_rank1.log"
        env: dict[str, str] = {}
        with engine_spawn_env(sleep_mode=False, env=env):
            assert env == {engine_logs.VLLM_CONFIG_ENV: str(tmp_path / "run" / "logs" / "vllm_logging_rank1.json")}
        assert env == {}
        logging.getLogger("vllm.anything").info("routed line")
        assert "routed line" in log_file.read_text()
    finally:
        engine_logs.release_engine_logs()
    env = {}
    with engine_spawn_env(sleep_mode=False, env=env):
        assert env == {}
    assert (list(vllm_logger.handlers), vllm_logger.propagate, vllm_logger.level, warnings.showwarning) == before
