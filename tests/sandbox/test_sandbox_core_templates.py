"""The release's executor template runs through the pool's fast path (its prelude run once per
zygote, sandbox.inside.template_run) with exactly the output of running the whole text in the child.
The shared pool has the code-judge preludes registered, as the service's pools do.

How the text-as-is run is forced: a leading "#" on the template's empty first line keeps every
line number and all semantics but changes the prelude's digest, so the pool no longer recognises
it (which is also what a near-miss of the release's template gets)."""
import asyncio

import pytest

from sandbox import Sandbox
from sandbox.core.preludes import KnownPreludes, PreludeDigest
from sandbox.service.executor_template import EXECUTOR_PRELUDE, wrap_code

SNIPPETS = [
    "print(6*7)",
    "x = 3\nx * 2",                                      # last-expression echo
    "print('a')\n'b'",                                   # echo even after output
    "x = None\nx",
    "print(input())\nprint(input())",                   # stdin
    "undefined_name",                                    # NameError in the last expression
    "def f():\n    return undefined_name\nf()\ny = 1",   # NameError in the body, a frame deep
    "a = 1\nb = a / 0\nc = 2",
    "def f(:\n pass",                                    # SyntaxError
    "print(1\n",
    "print('partial', end='')\nraise ValueError('bad')",  # output before os._exit(1)
    "raise KeyboardInterrupt",                           # escapes the template's `except Exception`
    "import sys\nsys.exit(3)",
    "import sys\nprint('out')\nsys.exit(0)",
    "print(1 is 1)\n2",                                  # a compile warning goes to the call's stderr
    "x: int = 1\nprint(__annotations__)",                # same compile flags both ways
    "print(__name__, __file__, sorted(k for k in globals() if not k.startswith('__')))",
    "import traceback\ntraceback.print_stack()",        # the whole stack, sandbox frames included
    "import sys\nprint(sys.stderr is sys.__stderr__, type(sys.stdout).__name__)",
    "exec('x = 5')\nx + 1",
    "compile('1 +', '<string>', 'eval')",                # the user's own compile is the real one
    "import ast\nast.dump(ast.parse('1'))",
    "while True:\n    pass",                             # timeout
    "",
    "# only a comment",
    "import sympy\nsympy.factorint(2**61-1)",           # heavy tier, straight from the scan
    "import numpy as np\nnp.arange(4).sum()",
    "m = __import__('sym' + 'py')\nm.Integer(7) * 6",   # hidden import: light tier, then re-routed
]


async def _both(pool, code: str, history=(), stdin="7\n8\n"):
    wrapped = wrap_code(code, history)
    fast, as_text = await asyncio.gather(pool.run(wrapped, stdin=stdin, timeout=1.5),
                                         pool.run("#" + wrapped, stdin=stdin, timeout=1.5))
    return fast, as_text


@pytest.mark.parametrize("code", SNIPPETS)
async def test_the_fast_path_prints_what_the_whole_template_prints(sandbox_pool, code):
    before = sandbox_pool.stats()["fast_template"]
    fast, as_text = await _both(sandbox_pool, code)
    assert sandbox_pool.stats()["fast_template"] == before + 1  # only the recognised one
    assert (fast.stdout, fast.stderr, fast.reason, fast.exit_code) == \
        (as_text.stdout, as_text.stderr, as_text.reason, as_text.exit_code)


async def test_history_cells_replay_quietly_on_the_fast_path(sandbox_pool):
    fast, as_text = await _both(sandbox_pool, "print(a + b)\nb", history=["a = 40\nprint('hidden')", "b = 2\n1/0"])
    assert (fast.stdout, fast.stderr) == (as_text.stdout, as_text.stderr) == ("42\n2\n", "")


async def test_expected_answers_on_the_fast_path(sandbox_pool):
    """Not only equal to the text-as-is run: right."""
    ok = await sandbox_pool.run(wrap_code("import sympy\nsympy.factorint(2**61-1)"))
    err = await sandbox_pool.run(wrap_code("a = 1\nb = a / 0"))
    assert (ok.reason, ok.stdout) == ("ok", "{2305843009213693951: 1}\n")
    assert (err.reason, err.stderr) == ("runtime_error", "ZeroDivisionError at line 2: division by zero\n  b = a / 0\n")


def test_recognition_is_exact():
    known = KnownPreludes([EXECUTOR_PRELUDE])
    recognise, length = known.recognise, len(EXECUTOR_PRELUDE)
    code = wrap_code("print(1)")
    assert recognise(code) == (PreludeDigest.of(EXECUTOR_PRELUDE).sha256, length)
    assert recognise(code[:length]) is None                             # a prelude with no cell
    assert recognise(code[:10] + " " + code[11:]) is None               # one byte changed
    assert recognise(code.replace("import sys\n", "import sys \n", 1)) is None
    assert recognise("print(1)") is None
    assert recognise("\nimport os\n" + "\ud800" * 4000) is None          # not even encodable


def test_a_prelude_known_by_digest_only_is_recognised_like_its_text():
    digest = PreludeDigest.of(EXECUTOR_PRELUDE)
    by_digest = KnownPreludes([PreludeDigest(digest.length, digest.sha256, "\nimport ")])
    assert by_digest.recognise(wrap_code("print(1)")) == (digest.sha256, digest.length)
    assert KnownPreludes().recognise(wrap_code("print(1)")) is None  # nothing registered: plain text


def test_preludes_must_end_in_a_newline():
    with pytest.raises(ValueError, match="newline"):
        KnownPreludes([EXECUTOR_PRELUDE.rstrip("\n")])


async def test_only_registered_preludes_take_the_fast_path():
    """A pool knows the preludes its caller registered, and no others; one registered later counts
    from then on."""
    pool = Sandbox(workers=1, isolation="none", unsafe_no_isolation=True, preload=("math",))
    try:
        plain = await pool.run(wrap_code("print(6*7)"))
        assert (plain.stdout, pool.stats()["fast_template"]) == ("42\n", 0)
        pool.register_prelude(EXECUTOR_PRELUDE)
        fast = await pool.run(wrap_code("print(6*7)"))
        assert (fast.stdout, pool.stats()["fast_template"]) == ("42\n", 1)
    finally:
        await pool.close()
