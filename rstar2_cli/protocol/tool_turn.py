"""The tool turn's token ids (`responses.tool_turn_ids`), without a template render per turn.

Why: rendering the chat template and encoding the whole turn through transformers was a quarter of
the roll-out's own CPU time (benchmarks/timing/bench_agent_loop.py), for a turn that is fixed text
around the tool outputs. `ToolTurnEncoder` renders each shape of turn (how many outputs, whether
the `<|im_end|>` is written) once, with stand-ins for the outputs, encodes its fixed pieces once,
and per turn encodes only each output with the newlines around it.

Why the ids are the same: the template writes each output between `<tool_response>\\n` and
`\\n</tool_response>`, as it is (chat_template.jinja, the "tool" role). The Rust tokenizer first
splits its input at the added tokens its added vocabulary matches (tokenizers 0.23,
tokenizers/src/tokenizer/added_vocabulary.rs `extract_and_normalize`: tokens with `normalized`
off are matched leftmost-longest on the raw text, `find_matches`), then normalizes, pre-tokenizes
and encodes each piece between them on its own. The encoder is used only where both tags are such
tokens, with `lstrip`, `rstrip` and `single_word` off (so a match is exactly the tag), and where no
added token contains a newline: then no match can cross from an output's `\\n...\\n` piece into the
fixed text, or back, so the matches, and the pieces, are those of the whole turn. Special tokens
must be matched too (transformers' `split_special_tokens` off), the tokenizer must encode through
the Rust tokenizer as it is (neither `encode` nor `_encode_plus` overridden: `TokenizersBackend.
_encode_plus`, transformers/tokenization_utils_tokenizers.py, calls `encode_batch` with
`add_special_tokens` as given) and with no truncation or padding set. Anywhere else, and for any
shape whose encoding differs from a full render's on a few probe outputs when it is built, the
encoder calls `tool_turn_ids` itself. tests/protocol/test_protocol_tool_turn.py compares the two on
random and edge-case outputs with both test tokenizers.
"""
from __future__ import annotations

import logging
import sys
from typing import Any

from rstar2_cli.protocol.responses import tool_turn_ids, tool_turn_text
from rstar2_cli.protocol.template import IM_END, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN

log = logging.getLogger(__name__)

OPEN, CLOSE = TOOL_RESPONSE_OPEN + "\n", "\n" + TOOL_RESPONSE_CLOSE   # around each output in the template
_STAND_IN = "\x00tool output {}\x00"
# Outputs each shape is checked on when it is built: empty, whitespace at both ends, special and
# protocol tokens inside, a lone newline, non-ASCII and a combining mark (NFC), long text.
PROBES = ("", "\n", " 42 \n\n", "<|im_end|>\n<tool_response>x</tool_response><|im_start|>",
          "e\u0301 ∑ 😀 \r\n\t", "Tool call success\nstdout: " + "1234567890 " * 60 + "\nexecution time: 0.02s")


def _rust_encoder(tokenizer) -> Any | None:
    """The Rust tokenizer when `tokenizer.encode(text, add_special_tokens=False)` is its
    `encode(text, add_special_tokens=False).ids` (module docstring), else None."""
    module = sys.modules.get("transformers.tokenization_utils_tokenizers")
    rust_backed = getattr(module, "TokenizersBackend", None)
    kind = type(tokenizer)
    if (rust_backed is None or not isinstance(tokenizer, rust_backed) or kind.encode is not rust_backed.encode
            or kind._encode_plus is not rust_backed._encode_plus or getattr(tokenizer, "split_special_tokens", True)):
        return None
    rust = tokenizer.backend_tokenizer
    if rust.encode_special_tokens or rust.truncation is not None or rust.padding is not None:
        return None
    added = rust.get_added_tokens_decoder().values()
    tags = {t.content: t for t in added if t.content in (TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)}
    if len(tags) != 2 or any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in tags.values()):
        return None
    if any("\n" in t.content for t in added):
        return None
    return rust


class ToolTurnEncoder:
    """`tool_turn_ids(tokenizer, texts, after_eos, force_reason)`, spliced (module docstring)."""

    def __init__(self, tokenizer, force_reason: bool = True) -> None:
        self.tokenizer = tokenizer
        self.force_reason = force_reason
        self._rust = _rust_encoder(tokenizer)
        self._shapes: dict[tuple[int, bool], list[list[int]] | None] = {}

    @property
    def spliced(self) -> bool:
        """Whether turns are spliced (else each is rendered and encoded whole)."""
        return self._rust is not None

    def __call__(self, texts: list[str], after_eos: bool = True) -> list[int]:
        fixed = None
        if self._rust is not None and texts:
            key = (len(texts), after_eos)
            if key not in self._shapes:
                self._shapes[key] = self._build(*key)
            fixed = self._shapes[key]
        if fixed is None:
            return tool_turn_ids(self.tokenizer, texts, after_eos=after_eos, force_reason=self.force_reason)
        return self._splice(fixed, texts)

    def _splice(self, fixed: list[list[int]], texts: list[str]) -> list[int]:
        encode = self._rust.encode
        ids = list(fixed[0])
        for text, after in zip(texts, fixed[1:]):
            ids += encode("\n" + text + "\n", add_special_tokens=False).ids
            ids += after
        return ids

    def _build(self, n: int, after_eos: bool) -> list[list[int]] | None:
        """The ids of the fixed text around `n` outputs, or None where splicing is not exact."""
        stand_ins = [_STAND_IN.format(i) for i in range(n)]
        text = tool_turn_text(self.tokenizer, stand_ins, self.force_reason)
        text = text if after_eos else IM_END + text
        literals = []
        for s in stand_ins:
            head, sep, text = text.partition(s)
            if not sep or s in text:
                return None
            literals.append(head)
        literals.append(text)
        if not (all(p.endswith(OPEN) for p in literals[:-1]) and all(p.startswith(CLOSE) for p in literals[1:])):
            return None
        pieces = [literals[0][:-1]] + [p[1:-1] for p in literals[1:-1]] + [literals[-1][1:]]
        fixed = [self.tokenizer.encode(p, add_special_tokens=False) for p in pieces]
        for probe in PROBES:
            outputs = [probe] * n
            want = tool_turn_ids(self.tokenizer, outputs, after_eos=after_eos, force_reason=self.force_reason)
            if self._splice(fixed, outputs) != want:
                log.warning("tool turns of %d outputs are rendered whole: splicing differs on %r", n, probe)
                return None
        return fixed
