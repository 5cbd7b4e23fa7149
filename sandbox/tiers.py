"""Two tiers of zygotes: "heavy" (full preload) and "light" (stdlib-only preload).

Forking is copy-on-write, but the cost of fork+exit grows with the parent's memory map: a zygote
holding sympy+numpy costs ~2 ms of CPU per call, a stdlib-only one ~0.3 ms. Most tool calls
either use sympy/numpy or are plain arithmetic, so calls that cannot need a heavy module go to
light zygotes. The routing is only an optimisation: a mis-routed call still runs correctly (it
imports the module itself, just more slowly).
"""
from __future__ import annotations

import functools
import re
import sys

_IMPORT = re.compile(r"\b(?:from\s+([\w.]+)\s+import|import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*))")


def is_stdlib(module: str) -> bool:
    """True for a standard-library module name (dotted or not)."""
    return module.split(".")[0] in sys.stdlib_module_names


def split_preload(preload: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(light preload, heavy module names); the light tier is empty when nothing is heavy."""
    light = tuple(m for m in preload if is_stdlib(m))
    heavy = tuple(m for m in preload if m not in light)
    return (light, heavy) if heavy else ((), ())


def fits_light(text: str, heavy: tuple[str, ...]) -> bool:
    """True when `text` imports only stdlib modules and never names a heavy module."""
    if "__import__" in text or "importlib" in text:
        return False
    for match in _IMPORT.finditer(text):
        names = [match.group(1)] if match.group(1) else match.group(2).split(",")
        for name in names:
            if not is_stdlib(name.strip().split()[0]):
                return False
    return _naming(heavy).search(text) is None


@functools.lru_cache(maxsize=None)
def _naming(heavy: tuple[str, ...]) -> re.Pattern:
    """One pattern matching any heavy module name as a word (built once per pool's tuple)."""
    return re.compile(r"\b(?:%s)\b" % "|".join(map(re.escape, heavy))) if heavy else re.compile(r"(?!)")
