"""Notebook-style sessions (history replay)."""
from __future__ import annotations


async def test_later_cells_see_earlier_variables(sandbox_pool):
    assert (await sandbox_pool.run("import sympy\nx = sympy.Symbol('x')\nn = 5", session="s1")).ok
    result = await sandbox_pool.run("sympy.expand((x + 1) ** 2) + n", session="s1")
    assert result.stdout == "x**2 + 2*x + 6\n", result.stderr


async def test_replayed_output_is_not_repeated(sandbox_pool):
    await sandbox_pool.run("print('once'); y = 2", session="s2")
    assert (await sandbox_pool.run("y * 10", session="s2")).stdout == "20\n"


async def test_failed_cells_are_not_recorded(sandbox_pool):
    assert (await sandbox_pool.run("z = 1", session="s3")).ok
    assert not (await sandbox_pool.run("z = 2\n1/0", session="s3")).ok
    assert (await sandbox_pool.run("z", session="s3")).stdout == "1\n"


async def test_sessions_are_separate_and_closable(sandbox_pool):
    await sandbox_pool.run("secret = 7", session="a")
    assert (await sandbox_pool.run("secret", session="b")).reason == "runtime_error"
    assert (await sandbox_pool.run("secret")).reason == "runtime_error"  # no session: fresh state
    sandbox_pool.close_session("a")
    assert "NameError" in (await sandbox_pool.run("secret", session="a")).stderr


async def test_stdin_is_replayed_with_its_cell(sandbox_pool):
    await sandbox_pool.run("k = int(input())", stdin="9\n", session="s4")
    assert (await sandbox_pool.run("k + int(input())", stdin="1\n", session="s4")).stdout == "10\n"
