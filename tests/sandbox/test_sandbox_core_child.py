"""Notebook semantics of one cell, tested in-process (no jail): echo, short errors, exits, stdin."""
from __future__ import annotations

import io
import sys

import pytest

from sandbox import Limits, RunResult
from sandbox.inside.child import execute
from sandbox.core.tiers import fits_light


@pytest.fixture
def cell(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO())

    def run(code, stdin=None, history=None):
        code_, reason = execute(code, stdin, history)
        out = capsys.readouterr()
        return code_, reason, out.out, out.err
    return run


def test_last_expression_is_echoed_like_a_notebook(cell):
    assert cell("x = 6\nx * 7") == (0, "ok", "42\n", "")
    assert cell("'a' + 'b'")[2] == "'ab'\n"  # repr, like Jupyter's Out


def test_none_and_printed_cells_are_not_echoed(cell):
    assert cell("None")[2] == ""
    assert cell("print('hi')\n1 + 1")[2] == "hi\n"
    assert cell("x = 1")[2] == ""


def test_error_text_is_short_with_line_and_source(cell):
    code, reason, out, err = cell("a = 1\nb = 0\nc = a / b\n")
    assert (code, reason, out) == (1, "runtime_error", "")
    assert err == "Line 3: ZeroDivisionError: division by zero\n    c = a / b\n"


def test_error_inside_user_function_points_at_deepest_user_line(cell):
    err = cell("def f(n):\n    return [1][n]\n\nf(5)")[3]
    assert err.startswith("Line 2: IndexError: list index out of range")
    assert "Traceback" not in err


def test_syntax_error_is_short(cell):
    err = cell("x = (1 +\nprint(x)")[3]
    assert err.startswith("Line 1: SyntaxError:")
    assert "Traceback" not in err


def test_system_exit_and_keyboard_interrupt(cell):
    assert cell("raise SystemExit")[:2] == (0, "ok")
    assert cell("import sys; sys.exit(3)")[:2] == (3, "runtime_error")
    code, reason, _, err = cell("raise KeyboardInterrupt")
    assert (code, reason) == (1, "runtime_error") and "KeyboardInterrupt" in err


def test_memory_error_is_classified(cell):
    assert cell("raise MemoryError")[1] == "memory"


def test_stdin_feeds_input(cell):
    assert cell("a = int(input()); b = int(input()); a + b", stdin="3\n4\n")[2] == "7\n"


def test_history_is_replayed_silently(cell):
    assert cell("print(x + 1)", history=[["print('noisy'); x = 41", None]]) == (0, "ok", "42\n", "")


def test_limits_validation_names_the_field():
    with pytest.raises(ValueError, match="Limits.timeout"):
        Limits(timeout=0)
    with pytest.raises(ValueError, match="Limits.memory_mb"):
        Limits(memory_mb="big")
    assert Limits(cpu_time=2).for_call(30)["cpu_time"] == 30  # a longer timeout lifts the CPU cap


def test_run_result_shape():
    result = RunResult(stdout="1\n", stderr="", exit_code=0, wall_time=0.01, reason="ok")
    assert result.ok and RunResult.from_dict(result.to_dict()) == result
    with pytest.raises(ValueError, match="reason"):
        RunResult(stdout="", stderr="", exit_code=0, wall_time=0.0, reason="weird")


@pytest.mark.parametrize("code, light", [
    ("print(1+1)", True), ("import math, fractions as F; math.pi", True),
    ("import sympy; sympy.factorint(10)", False), ("x = 1; import numpy as np", False),
    ("from scipy import special", False), ("__import__('sympy')", False),
])
def test_light_tier_routing(code, light):
    assert fits_light(code, ("numpy", "sympy")) is light


def test_history_cell_that_exited_cleanly_replays(cell):
    assert cell("print(v)", history=[["v = 5\nimport sys; sys.exit(0)", None]])[2] == "5\n"
