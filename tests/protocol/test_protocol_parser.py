"""Tool-call parsing, in rollout.parse_messages "strict" mode with rollout.unclosed_tag_feedback:
valid Hermes calls become ToolCalls, every malformed one a teachable error. The release's own
wording (the default) is checked in test_protocol_release_parse.py."""
import functools
import json

import pytest

from rstar2_cli.protocol import ParseError, ToolCall, format_tool_call, get_tools, parse_tool_calls

TOOLS = get_tools("python_code_with_standard_io", "python_notebook")
strict = functools.partial(parse_tool_calls, messages="strict", unclosed_feedback=True)


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_valid_call_is_parsed_with_defaults_filled():
    text = "<reason>check</reason>\n" + block(format_tool_call("python_code_with_standard_io", {"code": "print(1)"}))
    [call] = strict(text, TOOLS, max_calls=4)
    assert isinstance(call, ToolCall)
    assert call.name == "python_code_with_standard_io"
    assert call.arguments == {"code": "print(1)", "input": ""}


def test_text_without_tags_has_no_calls():
    assert strict("<reason>x</reason><answer>\\boxed{2}</answer><|im_end|>", TOOLS, 4) == []


def test_several_calls_keep_their_order():
    text = (block(format_tool_call("python_notebook", {"code": "a = 1"})) + "\n"
            + block(format_tool_call("python_code_with_standard_io", {"code": "print(input())", "input": "7"})))
    calls = strict(text, TOOLS, 4)
    assert [c.name for c in calls] == ["python_notebook", "python_code_with_standard_io"]
    assert calls[1].arguments["input"] == "7"


@pytest.mark.parametrize(
    "body, expected",
    [
        ('{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)"', "not valid JSON"),
        ("[1, 2]", 'JSON object with "name" and "arguments"'),
        ('{"name": "python_code_with_standard_io"}', 'JSON object with "name" and "arguments"'),
        ('{"name": "bash", "arguments": {"cmd": "ls"}}', 'unknown tool "bash"'),
        ('{"name": "python_code_with_standard_io", "arguments": {"input": ""}}', 'missing required argument "code"'),
        (
            '{"name": "python_code_with_standard_io", "arguments": {"code": 5, "input": ""}}',
            'argument "code" of tool "python_code_with_standard_io" must be a string, got integer',
        ),
        (
            '{"name": "python_code_with_standard_io", "arguments": {"code": "1", "timeout": 3}}',
            'unexpected argument "timeout"',
        ),
        ('{"name": "python_code_with_standard_io", "arguments": "print(1)"}', '"arguments" of tool'),
        ('{"name": "python_notebook", "arguments": {"code": "1"}, "id": 3}', 'unexpected key "id"'),
    ],
)
def test_malformed_call_becomes_error_naming_the_problem(body, expected):
    [err] = strict(block(body), TOOLS, 4)
    assert isinstance(err, ParseError)
    assert expected in err.message
    assert err.message.startswith("Error:") and len(err.message) < 300


def test_unclosed_tag_is_an_error():
    text = '<tool_call>\n{"name": "python_notebook", "arguments": {"code": "1"}}<|im_end|>'
    [err] = strict(text, TOOLS, 4)
    assert isinstance(err, ParseError) and "not closed" in err.message


def test_reopened_tag_marks_the_first_as_unclosed_and_parses_the_second():
    good = format_tool_call("python_notebook", {"code": "x = 2"})
    first, second = strict("<tool_call>{oops\n" + block(good), TOOLS, 4)
    assert isinstance(first, ParseError) and "not closed" in first.message
    assert isinstance(second, ToolCall) and second.arguments == {"code": "x = 2"}


def test_stray_closing_tag_is_an_error():
    [err] = strict("I will call python </tool_call>", TOOLS, 4)
    assert isinstance(err, ParseError) and "without a matching <tool_call>" in err.message


def test_calls_beyond_the_cap_get_an_error_and_are_not_run():
    calls = "\n".join(block(format_tool_call("python_notebook", {"code": f"print({i})"})) for i in range(4))
    out = strict(calls, TOOLS, max_calls=2)
    assert [type(x) for x in out] == [ToolCall, ToolCall, ParseError, ParseError]
    assert "only the first 2" in out[2].message


def test_only_offered_tools_are_accepted():
    only_stdio = get_tools("python_code_with_standard_io")
    [err] = strict(block(format_tool_call("python_notebook", {"code": "1"})), only_stdio, 4)
    assert isinstance(err, ParseError) and "Available tools: python_code_with_standard_io" in err.message


def test_format_tool_call_is_hermes_json():
    body = format_tool_call("python_code_with_standard_io", {"code": "print('é')", "input": ""})
    assert json.loads(body) == {
        "name": "python_code_with_standard_io",
        "arguments": {"code": "print('é')", "input": ""},
    }
    assert "é" in body   # not \u-escaped: what the model reads is what it wrote


def test_unknown_tool_name_in_registry_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tool 'shell'"):
        get_tools("shell")
