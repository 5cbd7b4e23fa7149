"""protocol/splice.py: spliced template renders are token for token the whole render's encoding,
on both test tokenizers (the tiny one has a trained BPE, NFC and Qwen's pre-tokenizer; the
Qwen3-style one has Qwen3's added-token table). Tool turns (`tool_turn_ids`): one to three outputs,
after an end-of-turn or a `</tool_call>`, with and without the forced `<reason>`. First prompts
(`encode_messages` of `problem_messages`): with and without tools and a system prompt. Inserts:
random texts dense in whitespace, newlines, tags, special tokens, braces and non-ASCII (combining
marks too); the tool texts the loop writes (release and rstar2 formats, cut and uncut, parse
errors); empty and very long texts. Where splicing is not exact it is not used."""
from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken

import rstar2_cli.protocol.responses as responses
from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol.parser import ParseError
from rstar2_cli.protocol.responses import response_text, tool_turn_ids
from rstar2_cli.protocol.splice import PromptEncoder, Splice, ToolTurnEncoder
from rstar2_cli.protocol.template import encode_messages, problem_messages
from rstar2_cli.protocol.tools import get_tools, tool_schemas
from sandbox.core.result import RunResult

PIECES = ["\n", "\n\n", " ", "  ", "\t", "\r\n", "x", "42", "print(1)", "é", "e\u0301", "∑", "😀", "中文",
          "{", "}", '"', "\\", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>", "<reason>",
          "<tool_call>", "<", ">", "|", "Tool call success", "stdout: ", "Traceback (most recent call last):", "\x00",
          "\u00a0", "{problem}", "$\\frac{1}{2}$", "<answer>", "</answer>"]


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
    assert all(encode.shape(n, after_eos) is not None for n in (1, 2, 3) for after_eos in (True, False))
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


@pytest.mark.parametrize("force_reason, system, with_tools", [(True, None, True), (False, None, True),
                                                             (True, "Be brief.", False)])
def test_spliced_prompts_are_the_whole_render_token_for_token(tok, force_reason, system, with_tools):
    tools = tool_schemas(get_tools("python_code_with_standard_io")) if with_tools else None
    encode = PromptEncoder(tok, system, tools, force_reason)
    assert encode.splice is not None
    problems = ["", "What is 6*7?", "Let $n = 17$. Find the remainder when $n^2 + 17$ is divided by 97.", "x" * 20_000]
    problems += outputs(7)[:200]
    for problem in problems:
        assert encode(problem) == encode_messages(tok, problem_messages(problem, system), tools,
                                                  add_generation_prompt=True, force_reason=force_reason), problem


def test_a_render_that_does_not_insert_as_written_is_not_spliced(tok):
    """The probes catch a render that changes its insert (here: strips it)."""
    def stripping(inserts):
        return "<|im_start|>user\n" + inserts[0].strip() + "<|im_end|>\n"
    assert Splice.build(tok, stripping, 1) is None
    assert Splice.build(tok, lambda inserts: "<|im_start|>user\n" + inserts[0] + "<|im_end|>\n", 1) is not None


def test_tokenizers_where_splicing_is_not_exact_render_whole():
    """A tokenizer whose `encode` is not the Rust encode, one that splits special tokens, and ones
    with an added token that a cut could fall inside (a `>` before its end, a `<` after its start):
    every tool turn and prompt is rendered and encoded whole."""
    tiny = build_tokenizer(default_corpus(0), 512)

    class Lower(type(tiny)):
        def encode(self, text, *args, **kwargs):
            return super().encode(text.lower(), *args, **kwargs)

    lower = Lower.__new__(Lower)
    lower.__dict__.update(tiny.__dict__)
    splitting = build_tokenizer(default_corpus(0), 512)
    splitting.split_special_tokens = True
    straddling = []
    for content in ("e>\n", "x<"):
        t = build_tokenizer(default_corpus(0), 512)
        t.add_tokens([AddedToken(content, normalized=False)])
        straddling.append(t)
    for t in (lower, splitting, *straddling):
        encode, prompt = ToolTurnEncoder(t), PromptEncoder(t, None, None)
        assert encode.shape(1) is None and prompt.splice is None
        for group in (["42"], ["A\n", " B "], ["<|im_end|>"]):
            assert encode(group) == tool_turn_ids(t, group)
        for problem in ("6*7 e>\n x<", "6*7 = x"):        # the second ends on the x of x<, before <|im_end|>
            assert prompt(problem) == encode_messages(t, problem_messages(problem), None, add_generation_prompt=True)


def test_an_inserts_own_single_word_token_beside_a_cut_keeps_its_ids():
    """A tag ending on a word character: an added `single_word` token at the insert's start is not
    matched in the whole text (a word is beside it) but would be in the insert alone."""
    t = build_tokenizer(default_corpus(0), 512)
    t.add_tokens([AddedToken("@@Z", normalized=False), AddedToken("foo", normalized=False, single_word=True)])

    def render(inserts):
        return "@@Z" + inserts[0] + "<|im_end|>"
    splice = Splice.build(t, render, 1)
    for insert in ("foo", "foo bar", " foo"):
        assert splice is None or splice([insert]) == t.encode(render([insert]), add_special_tokens=False)
