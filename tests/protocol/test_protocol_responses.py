"""rollout.response_format "rstar2": output then errors, limit messages, a middle cut that counts.
The release format (the default) is checked in test_protocol_release_responses.py."""
import pytest

from rstar2_cli.protocol import ParseError, format_run_result, response_text, truncate_middle
from sandbox.core.result import RunResult


def rr(stdout="", stderr="", reason="ok", code=0):
    return RunResult(stdout=stdout, stderr=stderr, exit_code=code, wall_time=0.01, reason=reason)


def test_stdout_then_stderr():
    assert format_run_result(rr("1\n2\n", "Traceback...\nZeroDivisionError: division by zero\n",
                                "runtime_error", 1)) == "1\n2\nTraceback...\nZeroDivisionError: division by zero"


def test_empty_output_tells_the_model_to_print():
    assert "print()" in format_run_result(rr())


@pytest.mark.parametrize("reason, expected", [
    ("timeout", "TimeoutError: execution exceeded the time limit of 10 seconds."),
    ("memory", "MemoryError"),
    ("output_limit", "OutputLimitError"),
    ("internal_error", "Sandbox internal error."),
])
def test_limit_reasons_are_explained_when_the_sandbox_said_nothing(reason, expected):
    assert expected in format_run_result(rr("partial", reason=reason, code=None), timeout=10)


def test_sandbox_explanations_are_not_duplicated():
    text = format_run_result(rr("", "Timeout: the code ran longer than 4 s and was stopped.", "timeout", None), 4)
    assert text == "Timeout: the code ran longer than 4 s and was stopped."


def test_middle_cut_keeps_head_and_tail_and_says_how_much_was_cut():
    text = "HEAD" + "x" * 5000 + "TAIL"
    out = truncate_middle(text, 200)
    assert len(out) <= 200 and out.startswith("HEAD") and out.endswith("TAIL")
    cut = int(out.split("...[")[1].split(" characters truncated")[0])
    assert len(out) - len(f"\n...[{cut} characters truncated]...\n") + cut == len(text)


def test_short_text_is_untouched():
    assert truncate_middle("abc", 64) == "abc"


def test_response_text_for_parse_errors_and_long_runs():
    assert response_text(ParseError("Error: bad", "raw"), 100, style="rstar2") == "Error: bad"
    assert len(response_text(rr("y" * 1000), 100, style="rstar2")) <= 100
