"""vLLM's own log lines (and Python warnings) go to a file in the run folder, not the terminal.

Why: every engine start, sleep, wake and weight load prints vLLM INFO lines, and a reload prints
`RotaryEmbedding: Failed to load weights` for the rotary cache, which is computed from the config,
not loaded, and which vLLM restores itself (vllm/model_executor/model_loader/reload/layerwise.py,
`finalize_layerwise_processing`). In a terminal these bury the run's own progress lines. So, unless
`RSTAR2_VERBOSE=1` (`rstar2 rl --verbose`, `rstar2 quickstart --verbose`) or the user set
`VLLM_LOGGING_CONFIG_PATH` themselves, `route_engine_logs` sends them to `<out_dir>/logs/vllm_rank<R>.log`:
- in this process, by giving the `vllm` logger a file handler (its client side logs here);
- in every engine started after it, through `VLLM_LOGGING_CONFIG_PATH`, set only while the engine is
  built (`engine_env.engine_spawn_env` adds `spawn_env()`): vLLM reads it into the VllmConfig's
  LoggingConfig, which the engine core applies (vllm/v1/engine/core.py `run_engine_core`; in this
  process too on CPU, `AsyncLLM` -> `configure_logging_if_needed`). Errors still reach the terminal
  (a second handler at ERROR on stderr). This process's environment keeps no trace of it.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

VERBOSE_ENV = "RSTAR2_VERBOSE"
VLLM_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
_routed: list[Path] = []    # the logging config the next engine is built with (route_engine_logs)
_saved: list[tuple[logging.Logger, list[logging.Handler], bool, int]] = []   # what routing replaced


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def logging_config(log_file: Path) -> dict:
    """The dictConfig an engine process applies: vLLM's loggers to `log_file`, errors to stderr too."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": FORMAT}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(log_file), "formatter": "plain",
                     "level": "DEBUG"},
            "errors": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain",
                       "level": "ERROR"},
        },
        "loggers": {"vllm": {"handlers": ["file", "errors"], "level": "INFO", "propagate": False}},
    }


def route_engine_logs(out_dir: str | Path, rank: int = 0) -> Path | None:
    """Send vLLM's log lines and Python warnings of this process and of the engines it starts next to
    `<out_dir>/logs/vllm_rank<rank>.log` (module docstring); the file, or None when they stay on the
    terminal (`RSTAR2_VERBOSE`, or a `VLLM_LOGGING_CONFIG_PATH` of the user's)."""
    if verbose() or os.environ.get(VLLM_CONFIG_ENV):
        release_engine_logs()
        return None
    logs = Path(out_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"vllm_rank{rank}.log"
    config = logs / f"vllm_logging_rank{rank}.json"
    config.write_text(json.dumps(logging_config(log_file), indent=1))
    release_engine_logs()     # a previous run's routing in this process (the quickstart's RoC, then GRPO)
    _routed[:] = [config]
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter(FORMAT))
    errors = logging.StreamHandler()
    errors.setLevel(logging.ERROR)
    errors.setFormatter(logging.Formatter(FORMAT))
    for name, level in (("vllm", logging.INFO), ("py.warnings", logging.WARNING)):
        logger = logging.getLogger(name)
        _saved.append((logger, list(logger.handlers), logger.propagate, logger.level))
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.addHandler(errors)
        logger.propagate = False
        logger.setLevel(level)
    logging.captureWarnings(True)
    return log_file


def spawn_env() -> dict[str, str]:
    """What an engine is built with (`engine_env.engine_spawn_env`): the routed logging config, if any."""
    return {VLLM_CONFIG_ENV: str(_routed[0])} if _routed and _routed[0].is_file() else {}


def release_engine_logs() -> None:
    """The run is over (`RolloutSide.close`): engines built later in this process log as vLLM would,
    and the loggers get back their own handlers."""
    _routed.clear()
    closed: set[int] = set()
    while _saved:
        logger, handlers, propagate, level = _saved.pop()
        for ours in list(logger.handlers):
            logger.removeHandler(ours)
            if id(ours) not in closed:
                closed.add(id(ours))
                ours.close()
        for handler in handlers:
            logger.addHandler(handler)
        logger.propagate, logger.level = propagate, level
    logging.captureWarnings(False)
