"""The release's tool-response text (rstar2_agent/tools/code_judge_utils.py) and verl's 256-char
middle cut, the default rollout.response_format; expected strings are written out by hand."""
import pytest

from rstar2_cli.config import RolloutConfig
from rstar2_cli.protocol import ParseError, response_text
from rstar2_cli.protocol.responses import release_run_text, truncate_release
from sandbox.core.result import RunResult

MAX = RolloutConfig().tool_response_max_chars


def rr(stdout="", stderr="", reason="ok", wall=0.0123):
    return RunResult(
        stdout=stdout, stderr=stderr, exit_code=0 if reason == "ok" else None, wall_time=wall, reason=reason
    )


def test_defaults_are_the_releases_limits():
    cfg = RolloutConfig()
    assert (cfg.tool_response_max_chars, cfg.tool_timeout, cfg.max_calls_per_turn) == (256, 4.0, 1)
    assert (cfg.response_format, cfg.parse_messages, cfg.force_reason) == ("release", "release", True)


def test_success_lists_stdout_then_the_time():
    assert response_text(rr("42\n"), MAX) == "Tool call success\nstdout: 42\n\nexecution time: 0.01s"


def test_success_without_output_has_only_the_time():
    assert response_text(rr(wall=1.005), MAX) == "Tool call success\nexecution time: 1.00s"


def test_failure_has_an_empty_reason_for_an_exception_and_both_streams():
    err = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n"
    assert response_text(rr("1\n", err, "runtime_error", 0.2), MAX) == (
        "Tool call failure\nreason: \nstdout: 1\n\nstderr: " + err + "\nexecution time: 0.20s")


@pytest.mark.parametrize("reason, judge_reason", [("timeout", "worker_timeout"), ("internal_error", "internal_error"),
                                                  ("memory", ""), ("output_limit", "")])
def test_failure_reasons_use_code_judges_names(reason, judge_reason):
    assert (
        release_run_text(rr("", "", reason, 4.01))
        == f"Tool call failure\nreason: {judge_reason}\nexecution time: 4.01s"
    )


def test_long_text_is_cut_in_the_middle_like_verl():
    out = response_text(rr("A" * 200 + "B" * 200), MAX)
    full = "Tool call success\nstdout: " + "A" * 200 + "B" * 200 + "\nexecution time: 0.01s"
    assert out == full[:128] + "...(truncated)..." + full[-128:]
    assert truncate_release("x" * 256, 256) == "x" * 256          # at the limit: untouched


def test_parse_errors_are_sent_uncut():
    message = "Failed to decode tool call: " + "y" * 400
    assert response_text(ParseError(message, "raw"), MAX) == message
