"""protocol/tool_turn.py: the spliced tool turn is token for token `tool_turn_ids` (the template's
render of the tool messages, encoded whole), on both test tokenizers (the tiny one has a trained
BPE, NFC and Qwen's pre-tokenizer; the Qwen3-style one has Qwen3's added-token table), for one to
three outputs, after an end-of-turn or a `</tool_call>`, with and without the forced `<reason>`:
random outputs dense in whitespace, newlines, tags, special tokens and non-ASCII (combining marks
too); the tool texts the loop writes (release and rstar2 formats, cut and uncut, parse errors);
empty and very long outputs. Where splicing is not exact it is not used."""
from __future__ import annotations

import random

import pytest

import rstar2_cli.protocol.responses as responses
from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol.parser import ParseError
from rstar2_cli.protocol.responses import response_text, tool_turn_ids
from rstar2_cli.protocol.tool_turn import ToolTurnEncoder
from sandbox.core.result import RunResult

PIECES = ["\n", "\n\n", " ", "  ", "\t", "\r\n", "x", "42", "print(1)", "é", "e\u0301", "∑", "😀", "中文",
          "{", "}", '"', "\\", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>", "<reason>",
          "<tool_call>", "<", ">", "|", "Tool call success", "stdout: ", "Traceback (most recent call last):", "\x00",
          "\u00a0"]


@pytest.fixture(scope="module", params=["tiny", "qwen3_style"])
def tok(request):
    if request.param == "tiny":
        return build_tokenizer(default_corpus(0), 512)
    return build_qwen3_style_tokenizer()


def outputs(seed: int) -> list[str]:
    rng = random.Random(seed)
    runs = [RunResult(stdout=o, stderr=e, exit_code=0 if r == "ok" else 1, wall_time=w, reason=r)
            for o, e, r, w in [("42\n", "", "ok", 0.01), ("", "ZeroDivisionError: division by zero\n", "runtime_error",
                                                                      0.03), ("é ∑ 😀\n" * 200, "", "ok", 1.5),
                                ("", "", "timeout", 10.0), ("x" * 5000, "warn\n", "ok", 0.2), ("  \n", "", "ok", 0.0)]]
    texts = ["", " ", "\n", "\n\n", " \n ", "42", "42\n", " 42 ", "a" * 20_000, "\n" * 50 + "x" + " " * 50]
    texts += [response_text(r, 256, 10.0, style) for r in runs for style in ("release", "rstar2")]
    texts += [response_text(ParseError(m, ""), 256) for m in (
        "Failed to decode tool call: Expecting ',' delimiter: line 1 column 88 (char 87)",
        "Error: <tool_call> was not closed with </tool_call>.")]
    texts += ["".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 40))) for _ in range(300)]
    return texts


@pytest.mark.parametrize("force_reason", [True, False])
def test_spliced_turns_are_the_whole_render_token_for_token(tok, force_reason):
    encode = ToolTurnEncoder(tok, force_reason)
    assert encode.spliced
    rng = random.Random(int(force_reason))
    texts = outputs(int(force_reason))
    for i, text in enumerate(texts):
        group = [text] + rng.sample(texts, i % 3)          # one to three outputs in the turn
        after_eos = i % 4 != 0
        assert encode(group, after_eos) == tool_turn_ids(tok, group, after_eos=after_eos, force_reason=force_reason), \
            group


def test_a_built_shape_renders_no_template(tok, monkeypatch):
    """After a shape's first turn, a turn of that shape is encoded without a template render."""
    encode = ToolTurnEncoder(tok)
    want = tool_turn_ids(tok, ["7"])
    encode(["1"])

    def no_render(*args, **kwargs):
        raise AssertionError("rendered the template for a built shape")
    monkeypatch.setattr(responses, "render_messages", no_render)
    assert encode(["7"]) == want


def test_no_outputs_is_an_error_as_before(tok):
    with pytest.raises(ValueError, match="no tool responses"):
        ToolTurnEncoder(tok)([])


def test_tokenizers_where_splicing_is_not_exact_render_whole_turns():
    """A tokenizer whose `encode` is not the Rust encode, one that splits special tokens, and one
    with an added token that holds a newline: each turn is `tool_turn_ids` itself."""
    tiny = build_tokenizer(default_corpus(0), 512)

    class Lower(type(tiny)):
        def encode(self, text, *args, **kwargs):
            return super().encode(text.lower(), *args, **kwargs)

    lower = Lower.__new__(Lower)
    lower.__dict__.update(tiny.__dict__)
    splitting = build_tokenizer(default_corpus(0), 512)
    splitting.split_special_tokens = True
    newline_token = build_tokenizer(default_corpus(0), 512)
    newline_token.backend_tokenizer.add_tokens(["response>\n"])       # an added token with a newline
    for tok in (lower, splitting, newline_token):
        encode = ToolTurnEncoder(tok)
        assert not encode.spliced
        for group in (["42"], ["A\n", " B "], ["<|im_end|>"]):
            assert encode(group) == tool_turn_ids(tok, group)
