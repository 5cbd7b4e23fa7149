"""Two tiers of zygotes: "heavy" (full preload) and "light" (stdlib-only preload).

Forking is copy-on-write, but the cost of fork+exit grows with the parent's memory map: a zygote
holding sympy+numpy costs ~2 ms of CPU per call, a stdlib-only one ~0.3 ms. Most tool calls
either use sympy/numpy or are plain arithmetic, so calls that cannot need a heavy module go to
light zygotes.

Routing never breaks a call, in two steps:
  * this static scan sends a call to the heavy tier when its text, or a base64 payload inside it
    (as in the rStar release's executor template), imports or names a non-stdlib module, or uses
    `__import__`/`importlib`;
  * whatever the scan misses (a module name built at run time, a payload it cannot decode) is
    caught in the light zygote itself: the first import of a module that only the full tier can
    import ends the call, and the pool re-runs it in the heavy tier (sandbox.inside.child's
    FullTierFinder, over the paths of sandbox.jail.paths.full_tier_paths; the pool counts
    these as "rerouted").
"""
from __future__ import annotations

import base64
import binascii
import functools
import re
import sys

_IMPORT = re.compile(
    r"\b(?:from\s+([\w.]+)\s+import|import\s+([\w.]+(?:\s+as\s+\w+)?(?:\s*,\s*[\w.]+(?:\s+as\s+\w+)?)*))"
)


def is_stdlib(module: str) -> bool:
    """True for a standard-library module name (dotted or not)."""
    return module.split(".")[0] in sys.stdlib_module_names


def split_preload(preload: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(light preload, heavy module names); the light tier is empty when nothing is heavy."""
    light = tuple(m for m in preload if is_stdlib(m))
    heavy = tuple(m for m in preload if m not in light)
    return (light, heavy) if heavy else ((), ())


_B64_LITERAL = re.compile(r"""["']([A-Za-z0-9+/]{8,}={0,2})["']""")


def _payloads(text: str) -> list[str]:
    """The texts of the base64 string literals in `text` that decode to UTF-8 (only looked for
    when `text` calls b64decode: the release's executor template sends the code that way)."""
    if "b64decode" not in text:
        return []
    out = []
    for match in _B64_LITERAL.finditer(text):
        try:
            out.append(base64.b64decode(match.group(1), validate=True).decode())
        except (binascii.Error, ValueError):
            continue
    return out


def fits_light(text: str, heavy: tuple[str, ...], _depth: int = 0) -> bool:
    """True when `text` (and any base64 payload in it) imports only stdlib modules and never
    names a heavy module."""
    if _depth < 2 and not all(fits_light(p, heavy, _depth + 1) for p in _payloads(text)):
        return False
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
