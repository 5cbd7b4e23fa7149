"""Tier routing never breaks a call: imports hidden from the static scan run where they resolve."""
from __future__ import annotations

import base64

import pytest

from sandbox.service.executor_template import wrap_code
from sandbox.core.tiers import fits_light

HEAVY = ("numpy", "sympy")


def test_base64_payloads_are_scanned():
    assert fits_light(wrap_code("print(6*7)"), HEAVY)
    assert not fits_light(wrap_code("import sympy\nsympy.factorint(10)"), HEAVY)
    assert not fits_light(wrap_code("print(1)", history=["import numpy as np"]), HEAVY)
    hidden = base64.b64encode(b"import sympy").decode()
    assert not fits_light(f"import base64\nexec(base64.b64decode('{hidden}'))", HEAVY)


@pytest.mark.parametrize("code, stdout", [
    ("exec('imp' + 'ort sym' + 'py as s')\nprint(s.factorint(91))", "{7: 1, 13: 1}\n"),
    # a snippet that would have caught the ImportError and carried on must see the module
    ("try:\n    exec('imp' + 'ort num' + 'py as n')\n    print('have', n.__name__)\n"
     "except ImportError:\n    print('missing')", "have numpy\n"),
    # the output of the light-tier attempt is dropped: the re-run's is the answer
    ("print('before')\nexec('imp' + 'ort sym' + 'py')\nprint('after')", "before\nafter\n"),
])
async def test_hidden_full_tier_import_is_rerun_there(sandbox_pool, code, stdout):
    before = sandbox_pool.stats()["rerouted"]
    result = await sandbox_pool.run(code)
    assert (result.reason, result.stdout, result.stderr) == ("ok", stdout, "")
    assert sandbox_pool.stats()["rerouted"] == before + 1


async def test_missing_module_fails_in_the_light_tier_without_a_rerun(sandbox_pool):
    before = sandbox_pool.stats()["rerouted"]
    result = await sandbox_pool.run("exec('import no_such_module_anywhere')")
    assert result.reason == "runtime_error" and "No module named 'no_such_module_anywhere'" in result.stderr
    assert (await sandbox_pool.run("exec('import json'); print(json.dumps([1]))")).stdout == "[1]\n"
    assert sandbox_pool.stats()["rerouted"] == before


async def test_wrapped_imports_run_through_the_release_template(sandbox_pool):
    result = await sandbox_pool.run(wrap_code("import sympy\nsympy.factorint(2**61-1)"))
    assert (result.reason, result.stdout) == ("ok", "{2305843009213693951: 1}\n")
    numpy = await sandbox_pool.run(wrap_code("import numpy as np\nint(np.arange(5).sum())"))
    assert (numpy.reason, numpy.stdout) == ("ok", "10\n")
