"""Token ids to text exactly as `tokenizer.decode(ids, skip_special_tokens=False,
clean_up_tokenization_spaces=False)` gives it, at a fraction of its cost.

Why: the agent loop decodes every generated turn (to parse its calls) and every whole response (for
the grader), a few hundred ids at a time; decoding was a fifth of the roll-out's own CPU time
(benchmarks/timing/bench_agent_loop.py). Two exact shortcuts, each taken only where its premise
holds, else the next one down:

- `rust_backend`: for a tokenizers-backed tokenizer that overrides neither `decode` nor `_decode`,
  transformers' `decode` (transformers/tokenization_utils_base.py) only copies the ids through
  `to_py_obj`, an isinstance test per id, then `TokenizersBackend._decode`
  (transformers/tokenization_utils_tokenizers.py) returns `self._tokenizer.decode(ids,
  skip_special_tokens=...)` as it is when clean-up is off. The Rust tokenizer is called directly.
- `ByteDecoder`, when that Rust tokenizer's decoder is `ByteLevel` (Qwen's): tokenizers 0.23's
  `TokenizerImpl::decode` (tokenizers/src/tokenizer/mod.rs) maps each id to its token string (the
  added vocabulary first, then the model; an id with neither is dropped) and hands the strings to
  the decoder, and `ByteLevel`'s `decode_chain` (tokenizers/src/pre_tokenizers/byte_level.rs) turns
  each token into bytes (each character through GPT-2's byte <-> character table, or the token's
  own UTF-8 bytes when one of its characters is not in that table), concatenates them and returns
  `String::from_utf8_lossy`. So a table of each id's bytes, built once per tokenizer, decodes with a
  join and `bytes.decode("utf-8", "replace")` (which substitutes invalid sequences as
  `from_utf8_lossy` does: tests/protocol/test_protocol_detokenize.py compares the two on random ids,
  lone continuation bytes and cut characters included). It also decodes a response piece by piece
  (`ResponseDecoder`): the bytes of the whole are the concatenation of its pieces' bytes, so the
  text of the whole is one more join, not a second decode of every id.
"""
from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

Decode = Callable[[Sequence[int]], str]


def rust_backend(tokenizer) -> Any | None:
    """The `tokenizers.Tokenizer` whose `decode(ids, skip_special_tokens=...)` is `tokenizer.decode`
    with clean-up off, or None (module docstring). transformers is looked up only if loaded: a
    tokenizer of that class cannot exist otherwise (and importing it takes seconds)."""
    backend = sys.modules.get("transformers.tokenization_utils_tokenizers")
    rust_backed = getattr(backend, "TokenizersBackend", None)
    kind = type(tokenizer)
    if (rust_backed is not None and isinstance(tokenizer, rust_backed) and kind.decode is rust_backed.decode
            and kind._decode is rust_backed._decode):
        return tokenizer.backend_tokenizer
    return None


def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> printable character table (`bytes_char` in tokenizers' byte_level.rs)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_CHAR_TO_BYTE = {ord(c): chr(b) for b, c in _byte_to_char().items()}   # str.translate: char -> latin-1 byte
_TABLE_CHARS = frozenset(_byte_to_char().values())
_TABLES: "weakref.WeakKeyDictionary[Any, tuple[int, list[bytes | None]]]" = weakref.WeakKeyDictionary()


def token_bytes(token: str) -> bytes:
    """One token's bytes as `ByteLevel`'s decoder writes them (module docstring)."""
    if _TABLE_CHARS.issuperset(token):
        return token.translate(_CHAR_TO_BYTE).encode("latin-1")
    return token.encode()


def byte_table(backend) -> list[bytes | None] | None:
    """Each id's bytes at its index, for every id up to the largest the Rust tokenizer knows (b""
    for an id with no token, which its decode drops), then as many None: an index past the ids, or
    a negative one (which Python would count from the end), lands on None or outside the list, and
    the decoder hands those ids to the Rust decode. None when the decoder is not `ByteLevel`. Built
    once per tokenizer (and again if tokens were added since)."""
    decoders = sys.modules.get("tokenizers.decoders")
    if decoders is None or type(backend.decoder) is not decoders.ByteLevel:
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    cached = _TABLES.get(backend)
    if cached is not None and cached[0] == size:
        return cached[1]
    top = max(backend.get_vocab(with_added_tokens=True).values(), default=-1)
    table: list[bytes | None] = []
    for i in range(top + 1):
        token = backend.id_to_token(i)
        table.append(b"" if token is None else token_bytes(token))
    table += [None] * len(table)
    _TABLES[backend] = (size, table)
    return table


class ByteDecoder:
    """`decode(ids)` through the id -> bytes table (`byte_table`, module docstring). Any id that is
    not an index of a known id (past them, negative, not an int) sends the call to the Rust decode,
    which decides: it drops an id it has no token for and raises for one it cannot take."""

    def __init__(self, table: list[bytes | None], rust) -> None:
        self._get = table.__getitem__
        self._known = len(table) // 2
        self._table = table
        self._rust = rust

    def __call__(self, ids: Sequence[int]) -> str:
        try:
            return b"".join(map(self._get, ids)).decode("utf-8", "replace")
        except (IndexError, TypeError):
            return self._rust.decode(ids, skip_special_tokens=False)

    def raw(self, ids: Sequence[int]) -> bytes:
        """The bytes `decode` turns into text (its lossy UTF-8 step not yet applied)."""
        try:
            return b"".join(map(self._get, ids))
        except (IndexError, TypeError):
            self._rust.decode(ids, skip_special_tokens=False)   # raises where the Rust decode does
            known, table = self._known, self._table
            return b"".join(table[i] if 0 <= i < known else b"" for i in ids)   # else it drops unknown ids


def ids_decoder(tokenizer) -> Decode:
    """`tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)` as a
    function of the ids, through the cheapest exact path (module docstring)."""
    rust = rust_backend(tokenizer)
    if rust is None:
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    table = byte_table(rust)
    if table is None:
        return lambda ids: rust.decode(ids, skip_special_tokens=False)
    return ByteDecoder(table, rust)


class ResponseDecoder:
    """One response's text as it grows: `extend(ids)` as ids are appended, `last()` the text of the
    latest piece, `text(ids)` the whole (`ids`: every id appended, in order). With a `ByteDecoder`
    each id is mapped once and the whole is a join of the pieces' bytes; otherwise each is decoded."""

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._bytes = decode.raw if isinstance(decode, ByteDecoder) else None
        self._pieces: list[bytes] = []
        self._last: Sequence[int] = ()
        self._count = 0

    def extend(self, ids: Sequence[int]) -> None:
        self._count += len(ids)
        if self._bytes is not None:
            self._pieces.append(self._bytes(ids))
        self._last = ids

    def last(self) -> str:
        if self._bytes is None:
            return self._decode(self._last)
        return self._pieces[-1].decode("utf-8", "replace") if self._pieces else ""

    def text(self, ids: Sequence[int]) -> str:
        if self._bytes is None or self._count != len(ids):
            return self._decode(ids)
        return b"".join(self._pieces).decode("utf-8", "replace")
