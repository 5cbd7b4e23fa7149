"""Token ids of chat-template renders that differ only in some inserted texts, without a render or
a whole encode per call: the tool turn (`ToolTurnEncoder`, as `responses.tool_turn_ids`) and the
first prompt (`PromptEncoder`, as `template.encode_messages` of `problem_messages`).

Why: rendering the template and encoding the whole text through transformers was a quarter of the
roll-out's own CPU time (benchmarks/timing/bench_agent_loop.py), for texts that are fixed template
text around a tool output or a problem. A `Splice` renders the template once with stand-ins for the
inserted texts, encodes its fixed pieces once, and then encodes only each insert with the template
text between it and the nearest added tokens (`<tool_response>\\n` + output + `\\n`, or
`user\\n...This is the problem:\\n` + problem).

Why the ids are those of the whole render: the Rust tokenizer first splits its input at the added
tokens it finds (tokenizers 0.23, tokenizers/src/tokenizer/added_vocabulary.rs
`extract_and_normalize`: tokens with `normalized` off are found leftmost-longest in the raw text,
`find_matches`), then normalizes, pre-tokenizes and encodes each piece between them on its own; with
`add_special_tokens` off the post-processor adds nothing. Each insert's piece is cut at the end of
the last added token before it (tag L) and at the start of the first one after it (tag R). The cuts
are the whole text's own splits when no occurrence of any added token can straddle them, whatever
the insert: a straddling occurrence would hold L's last character before its own last one, or R's
first character after its own first one, which `Splice` checks no added token does; L and R must be
found where they are in the fixed text (the encoding of the piece before a cut ends with L's id, the
one after starts with R's) and be plain tokens (`normalized`, `lstrip`, `rstrip`, `single_word`
off), L's last and R's first character neither whitespace nor a word character (an added token in
the insert with `lstrip`, `rstrip` or `single_word` looks at the text beside it, `find_matches`),
and special tokens must be matched (`split_special_tokens` off). With Qwen3's table, L and R are
`<tool_response>` and `</tool_response>` around an output, `<|im_start|>` and `<|im_end|>` around
a problem (the tiny test tokenizer's L there is `</answer>`), and every added token is `<...>`.
The tokenizer must encode through the Rust tokenizer as it is: neither `encode` nor `_encode_plus`
overridden (`TokenizersBackend._encode_plus`, transformers/tokenization_utils_tokenizers.py, calls
`encode_batch` with `add_special_tokens` as given), no truncation or padding set. Anywhere else, or
where a splice differs from the whole render on a few probe inserts when it is built, the encoders
render and encode whole. tests/protocol/test_protocol_splice.py compares the two on random and
edge-case inserts with both test tokenizers.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from rstar2_cli.protocol.responses import tool_turn_ids, tool_turn_text
from rstar2_cli.protocol.template import IM_END, encode_messages, problem_messages, render_messages

log = logging.getLogger(__name__)

STAND_IN = "\x00insert {}\x00"
# Inserts every splice is checked on when it is built: empty, whitespace at both ends, special and
# protocol tokens inside, a lone newline, non-ASCII and a combining mark (NFC), long text.
PROBES = ("", "\n", " 42 \n\n", "<|im_end|>\n<tool_response>x</tool_response><|im_start|>",
          "e\u0301 ∑ 😀 \r\n\t", "Tool call success\nstdout: " + "1234567890 " * 60 + "\nexecution time: 0.02s")


def rust_encoder(tokenizer) -> Any | None:
    """The Rust tokenizer when `tokenizer.encode(text, add_special_tokens=False)` is its
    `encode(text, add_special_tokens=False).ids` and it matches special tokens (module docstring),
    else None."""
    module = sys.modules.get("transformers.tokenization_utils_tokenizers")
    rust_backed = getattr(module, "TokenizersBackend", None)
    kind = type(tokenizer)
    if (rust_backed is None or not isinstance(tokenizer, rust_backed) or kind.encode is not rust_backed.encode
            or kind._encode_plus is not rust_backed._encode_plus or getattr(tokenizer, "split_special_tokens", True)):
        return None
    rust = tokenizer.backend_tokenizer
    if rust.encode_special_tokens or rust.truncation is not None or rust.padding is not None:
        return None
    return rust


def _added_at(text: str, added: list[Any], last: bool) -> tuple[int, Any] | None:
    """The (end, token) of the added token occurrence that ends last in `text` (`last`), or the
    (start, token) of the one that starts first; None if there is none."""
    best: tuple[int, Any] | None = None
    for token in added:
        if not token.content:
            continue
        at = text.rfind(token.content) if last else text.find(token.content)
        if at < 0:
            continue
        edge = at + len(token.content) if last else at
        if best is None or (edge > best[0] if last else edge < best[0]):
            best = (edge, token)
    return best


class Splice:
    """`encode(render(inserts))` for a render whose text is `literals[0] + inserts[0] + literals[1]
    + ...`, spliced (module docstring). Build with `Splice.build`, which says None where it is not
    exact."""

    def __init__(self, rust, fixed: list[list[int]], heads: list[str], tails: list[str]) -> None:
        self._encode = rust.encode
        self.fixed, self.heads, self.tails = fixed, heads, tails

    def __call__(self, inserts: list[str]) -> list[int]:
        if len(inserts) != len(self.heads):
            raise ValueError(f"splice: {len(inserts)} inserts for a render of {len(self.heads)}")
        encode = self._encode
        ids = list(self.fixed[0])
        for head, text, tail, after in zip(self.heads, inserts, self.tails, self.fixed[1:]):
            ids += encode(head + text + tail, add_special_tokens=False).ids
            ids += after
        return ids

    @classmethod
    def build(cls, tokenizer, render: Callable[[list[str]], str], n: int) -> "Splice | None":
        """A splice of `render` (which writes its `n` inserts as they are), checked on `PROBES`
        against `tokenizer.encode(render(...))`; None where splicing is not exact."""
        rust = rust_encoder(tokenizer)
        if rust is None:
            return None
        stand_ins = [STAND_IN.format(i) for i in range(n)]
        text, literals = render(stand_ins), []
        for s in stand_ins:
            head, sep, text = text.partition(s)
            if not sep or s in text:
                return None
            literals.append(head)
        literals.append(text)
        table = rust.get_added_tokens_decoder()
        added, added_id = list(table.values()), {t.content: i for i, t in table.items()}
        ends, starts = [], []    # per insert: where its piece starts in the literal before it, and ends after
        for before, after in zip(literals, literals[1:]):
            left, right = _added_at(before, added, last=True), _added_at(after, added, last=False)
            if left is None or right is None or not (cls._plain(left[1]) and cls._plain(right[1])):
                return None
            if not (cls._edge(left[1].content[-1]) and cls._edge(right[1].content[0])):
                return None     # an insert's own added tokens could take whitespace, or see a word, across a cut
            if any(left[1].content[-1] in t.content[:-1] or right[1].content[0] in t.content[1:] for t in added):
                return None     # an added token could straddle a cut
            ends.append(left)
            starts.append(right)
        cut_at = [0] + [start for start, _ in starts]          # where each fixed piece starts in its literal
        end_at = [end for end, _ in ends] + [len(literals[-1])]
        fixed = [tokenizer.encode(lit[a:b], add_special_tokens=False) for lit, a, b in zip(literals, cut_at, end_at)]
        for i in range(n):
            if fixed[i][-1:] != [added_id[ends[i][1].content]] or fixed[i + 1][:1] != [added_id[starts[i][1].content]]:
                return None     # the tags are not found where they stand
        heads = [literals[i][ends[i][0]:] for i in range(n)]
        tails = [literals[i + 1][:starts[i][0]] for i in range(n)]
        splice = cls(rust, fixed, heads, tails)
        for probe in PROBES:
            if splice([probe] * n) != tokenizer.encode(render([probe] * n), add_special_tokens=False):
                log.warning("%d inserts are rendered whole: a splice differs on %r", n, probe)
                return None
        return splice

    @staticmethod
    def _plain(token) -> bool:
        """Matched exactly as written: on the raw text, with no whitespace taken either side, anywhere."""
        return not (token.normalized or token.lstrip or token.rstrip or token.single_word)

    @staticmethod
    def _edge(char: str) -> bool:
        """Neither whitespace nor a word character (`\\s`, `\\w` of added_vocabulary.rs, for which an
        added token with `lstrip`, `rstrip` or `single_word` looks past its own text), ASCII so that
        the two regex flavours agree."""
        return char.isascii() and not (char.isalnum() or char == "_" or char.isspace())


class ToolTurnEncoder:
    """`tool_turn_ids(tokenizer, texts, after_eos, force_reason)`: one `Splice` per shape of turn
    (how many outputs, whether the `<|im_end|>` is written), built on first use."""

    def __init__(self, tokenizer, force_reason: bool = True) -> None:
        self.tokenizer = tokenizer
        self.force_reason = force_reason
        self._shapes: dict[tuple[int, bool], Splice | None] = {}

    def shape(self, n: int, after_eos: bool = True) -> Splice | None:
        """The splice of turns of `n` outputs (None: they are rendered whole)."""
        if (n, after_eos) not in self._shapes:
            prefix = "" if after_eos else IM_END
            self._shapes[n, after_eos] = Splice.build(
                self.tokenizer, lambda outs: prefix + tool_turn_text(self.tokenizer, outs, self.force_reason), n)
        return self._shapes[n, after_eos]

    def __call__(self, texts: list[str], after_eos: bool = True) -> list[int]:
        splice = self.shape(len(texts), after_eos) if texts else None
        if splice is None:
            return tool_turn_ids(self.tokenizer, texts, after_eos=after_eos, force_reason=self.force_reason)
        return splice(texts)


class PromptEncoder:
    """`encode_messages(tokenizer, problem_messages(problem, system), tools, add_generation_prompt=True,
    force_reason)` for each problem, through one `Splice`."""

    def __init__(self, tokenizer, system: str | None, tools: list[dict] | None, force_reason: bool = True) -> None:
        self.tokenizer, self.system, self.tools, self.force_reason = tokenizer, system, tools, force_reason
        self.splice = Splice.build(tokenizer, lambda problems: self._render(problems[0]), 1)

    def _render(self, problem: str) -> str:
        return render_messages(self.tokenizer, problem_messages(problem, self.system), self.tools,
                               add_generation_prompt=True, force_reason=self.force_reason)

    def __call__(self, problem: str) -> list[int]:
        if self.splice is None:
            return encode_messages(self.tokenizer, problem_messages(problem, self.system), self.tools,
                                   add_generation_prompt=True, force_reason=self.force_reason)
        return self.splice([problem])
