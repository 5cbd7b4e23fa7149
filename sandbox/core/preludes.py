"""The executor-template preludes a pool recognises, so their calls take the template fast path.

Why: a client that wraps every call in the same stdlib-only script (imports, helper definitions,
then the call's own cells) makes each forked child run that prelude again. A pool that knows the
prelude exactly runs it once per zygote instead and compiles only the cells per call
(sandbox.inside.template_run); the output is the same bytes. Callers register the preludes they
send (`Sandbox(preludes=...)`, `Sandbox.register_prelude`): by text, or, for a text that is not at
hand, by its length and SHA-256 (`PreludeDigest`). Recognition is exact: one changed byte, and the
call runs as plain text.

A registered prelude is trusted: the zygote runs it as is, once, the first time a call starts with
it, before any limit of that call applies. So register only stdlib-only scripts that define
things and print nothing (the zygote's stdout is its answer pipe); the text must end in a newline
(the cells start on the next line).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

HEAD_CHARS = 64  # how much of a registered text is kept to skip hashing calls that cannot match


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class PreludeDigest:
    """A prelude known by its length and SHA-256. `head` is any prefix of its text (the longer,
    the fewer calls hashed in vain): a call that does not start with it is not hashed at all."""

    length: int
    sha256: str
    head: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"PreludeDigest.length: expected a positive int, got {self.length!r}")
        if not isinstance(self.sha256, str) or len(self.sha256) != 64:
            raise ValueError(f"PreludeDigest.sha256: expected 64 hex digits, got {self.sha256!r}")
        if len(self.head) > self.length:
            raise ValueError("PreludeDigest.head: longer than the prelude itself")

    @classmethod
    def of(cls, text: str) -> PreludeDigest:
        """The digest of a prelude's text (which must end in a newline)."""
        if not isinstance(text, str) or not text.endswith("\n"):
            raise ValueError("a prelude must be a str ending in a newline (its cells start on the next line)")
        return cls(len(text), sha256(text), text[:HEAD_CHARS])


class KnownPreludes:
    """The preludes one pool recognises. Registering is safe from any thread while calls run:
    the list is replaced whole, and a call reads it once."""

    def __init__(self, preludes=()) -> None:
        self._known: tuple[PreludeDigest, ...] = ()
        for prelude in preludes:
            self.add(prelude)

    def add(self, prelude: str | PreludeDigest) -> PreludeDigest:
        """Register a prelude by text or digest (again: no effect); returns its digest."""
        digest = prelude if isinstance(prelude, PreludeDigest) else PreludeDigest.of(prelude)
        if digest not in self._known:
            self._known = (*self._known, digest)
        return digest

    def __iter__(self):
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)

    def recognise(self, code: str) -> tuple[str, int] | None:
        """(sha256, length) of the registered prelude `code` starts with, or None. Exact: `code`
        must go on past the prelude, and the prelude's text must match byte for byte."""
        for known in self._known:
            length = known.length
            if (len(code) > length and code.startswith(known.head) and code[length - 1] == "\n"
                    and sha256(code[:length]) == known.sha256):
                return known.sha256, length
        return None
