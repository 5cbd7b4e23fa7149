"""The chat template: the release's prompt, Hermes tool calls, tool results in a user turn, the
forced <reason>, and a multi-turn render whose tokens are exactly prompt + generated + appended
tool-turn ids (the byte-for-byte comparison with the release's own template text is in
test_protocol_golden.py)."""
import pytest

from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol import (chat_template, encode_messages, format_tool_call, get_tools, install_chat_template,
                                 problem_messages, render_messages, tool_schemas, tool_turn_ids, tool_turn_text)
from rstar2_cli.protocol.template import SYSTEM_PROMPT

SCHEMAS = tool_schemas(get_tools("python_code_with_standard_io"))
CALL = format_tool_call("python_code_with_standard_io", {"code": "print(6 * 7)", "input": ""})


@pytest.fixture(scope="module", params=["tiny", "qwen3_style"])
def tok(request):
    if request.param == "tiny":
        return build_tokenizer(default_corpus(0), 512)
    return build_qwen3_style_tokenizer()


def test_prompt_is_the_releases_template(tok):
    text = render_messages(tok, problem_messages("What is 6*7?"), SCHEMAS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "\n\n# Tools\n")
    assert "The User asks a question" in text
    assert "The reasoning process is enclosed within <reason> </reason> and answer is enclosed within" in text
    assert "<reason> reasoning process here </reason> <answer> answer here </answer>." in text
    assert '"return"' not in text
    assert '<tools>\n{"type": "function", "function": {"name": "python_code_with_standard_io"' in text
    assert "\n</tools>\n\nFor each function call, return a json object" in text
    assert "<|im_start|>user\nYou must put your answer inside <answer> </answer> tags" in text
    assert "extracted automatically by the \\boxed{} tag.\nThis is the problem:\nWhat is 6*7?<|im_end|>\n" in text
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n<reason>")
    no_reason = render_messages(tok, problem_messages("What is 6*7?"), SCHEMAS, add_generation_prompt=True,
                                force_reason=False)
    assert no_reason == text[:-len("<reason>")]


def test_no_tools_no_tools_block_and_custom_system(tok):
    text = render_messages(tok, problem_messages("x", system="Be brief."), None, add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert "<tools>" not in text and not text.endswith("assistant\n")


def test_structured_tool_calls_render_like_generated_text(tok):
    """SFT data with `tool_calls` renders exactly like the text a model generates in the agent loop."""
    base = problem_messages("q")
    structured = base + [{"role": "assistant", "content": "<reason>compute</reason>", "tool_calls": [
        {"type": "function", "function": {"name": "python_code_with_standard_io",
                                          "arguments": {"code": "print(6 * 7)", "input": ""}}}]}]
    flat = base + [{"role": "assistant", "content": f"<reason>compute</reason>\n<tool_call>\n{CALL}\n</tool_call>"}]
    assert render_messages(tok, structured, SCHEMAS) == render_messages(tok, flat, SCHEMAS)


def test_tool_results_come_back_in_one_user_turn(tok):
    assert tool_turn_text(tok, ["42", "Error: x"]) == (
        "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n"
        "<tool_response>\nError: x\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>")
    assert tool_turn_text(tok, ["42"], force_reason=False).endswith("<|im_start|>assistant\n")


def test_multi_turn_render_equals_prompt_plus_generated_plus_tool_ids(tok):
    """Token by token: what the agent loop concatenates is what the template renders."""
    msgs = problem_messages("What is 6*7?")
    prompt = encode_messages(tok, msgs, SCHEMAS, add_generation_prompt=True)
    gen1_text = f"Let me compute it.</reason>\n<tool_call>\n{CALL}\n</tool_call>"
    gen2_text = "The tool says 42.</reason>\n<answer>The answer is $\\boxed{42}$.</answer>"
    gen1 = tok.encode(gen1_text + "<|im_end|>", add_special_tokens=False)
    tool = tool_turn_ids(tok, ["42\n"])
    gen2 = tok.encode(gen2_text + "<|im_end|>", add_special_tokens=False)
    # SFT rows may spell the forced <reason> out: the template writes it once either way
    convo = msgs + [{"role": "assistant", "content": "<reason>" + gen1_text}, {"role": "tool", "content": "42\n"},
                    {"role": "assistant", "content": gen2_text}]
    full = encode_messages(tok, convo, SCHEMAS)
    newline = tok.encode("\n", add_special_tokens=False)
    assert full == prompt + gen1 + tool + gen2 + newline
    # the boundary: the sampled <|im_end|>, then the tool turn opens the user turn at once
    vocab = tok.get_vocab()
    assert gen1[-1] == vocab["<|im_end|>"] and tool[0] == vocab["<|im_start|>"]
    assert tok.decode(tool).endswith("\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>")


def test_tool_turn_after_a_stop_at_tool_call_writes_the_im_end(tok):
    after_eos = tool_turn_ids(tok, ["42"])
    after_call = tool_turn_ids(tok, ["42"], after_eos=False)
    assert after_call == [tok.get_vocab()["<|im_end|>"]] + after_eos


def test_install_chat_template_replaces_a_foreign_template():
    tok = build_qwen3_style_tokenizer()
    assert tok.chat_template != chat_template()
    install_chat_template(tok)
    msgs = problem_messages("q")
    assert tok.apply_chat_template(msgs, tools=SCHEMAS, tokenize=False, add_generation_prompt=True) == \
        render_messages(tok, msgs, SCHEMAS, add_generation_prompt=True)


def test_unknown_role_is_rejected(tok):
    with pytest.raises(Exception, match="unknown message role narrator"):
        render_messages(tok, [{"role": "narrator", "content": "x"}])


def test_ids_decoder_is_the_tokenizers_decode_without_its_list_copy(tok, monkeypatch):
    """`ids_decoder` gives `decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)`
    character for character, special and protocol tokens included, without transformers' per-element
    `to_py_obj` pass over the ids (transformers/tokenization_utils_base.py `decode`): the agent loop
    decodes every turn and every whole response with it."""
    import random

    import transformers.tokenization_utils_base as base

    from rstar2_cli.protocol.template import ids_decoder

    rng = random.Random(0)
    cases = [[], list(range(len(tok))), tok.encode("<|im_start|>assistant\n<reason>é ∑ 42<|im_end|>\n",
                                                    add_special_tokens=False)]
    cases += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 300))] for _ in range(50)]
    want = [tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in cases]

    def no_copy(obj):
        raise AssertionError("decoded through to_py_obj")
    monkeypatch.setattr(base, "to_py_obj", no_copy)
    decode = ids_decoder(tok)
    assert [decode(ids) for ids in cases] == want


def test_ids_decoder_falls_back_to_decode_for_a_tokenizer_that_overrides_it(tok):
    from rstar2_cli.protocol.template import ids_decoder

    class Shouting(type(tok)):
        def decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super().decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs).upper()

    loud = Shouting.__new__(Shouting)
    loud.__dict__.update(tok.__dict__)
    ids = tok.encode("print(6 * 7)", add_special_tokens=False)
    assert ids_decoder(loud)(ids) == "PRINT(6 * 7)"
