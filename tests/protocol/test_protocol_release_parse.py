"""The release's tool-call parsing (rstar2_agent/tools/tool_parser.py + verl's `_call_tool`), the
default rollout.parse_messages: its error wording, defaults for missing arguments, dropped extras."""
import pytest

from rstar2_cli.protocol import ParseError, ToolCall, format_tool_call, get_tools, parse_tool_calls

TOOLS = get_tools("python_code_with_standard_io")


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_missing_arguments_default_to_empty_strings_and_extras_are_ignored():
    [call] = parse_tool_calls(
        block('{"name": "python_code_with_standard_io", "arguments": {"code": "print(1)", "x": 1}}'), TOOLS, 1
    )
    assert isinstance(call, ToolCall) and call.arguments == {"code": "print(1)", "input": ""}


@pytest.mark.parametrize("body, message", [
    ('{"name": "python_code_with_standard_io", "arguments": {"code": "1"',
     "Failed to decode tool call: Expecting ',' delimiter: line 3 column 1 (char 68)"),
    ('{"arguments": {}}', "Failed to decode tool call: 'name'"),
    ('{"name": "python_code_with_standard_io"}', "Failed to decode tool call: 'arguments'"),
    ('{"name": "bash", "arguments": {}}', "Error when executing tool: 'bash'"),
    ('{"name": "python_code_with_standard_io", "arguments": "print(1)"}',
     "Error when executing tool: 'str' object has no attribute 'get'"),
    ('{"name": "python_code_with_standard_io", "arguments": {"code": 5}}',
     "Error when executing tool: 'int' object has no attribute 'encode'"),
])
def test_malformed_calls_get_the_releases_words(body, message):
    [err] = parse_tool_calls(block(body), TOOLS, 1)
    assert isinstance(err, ParseError) and err.message == message


def test_an_unclosed_call_ends_the_turn_without_feedback_unless_asked():
    text = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {"code": "1"}}'
    assert parse_tool_calls(text, TOOLS, 1) == []
    [err] = parse_tool_calls(text, TOOLS, 1, unclosed_feedback=True)
    assert err.message == "Error: <tool_call> was not closed with </tool_call>."


def test_calls_beyond_the_cap_are_dropped():
    two = block(format_tool_call("python_code_with_standard_io", {"code": "1", "input": ""})) + block("{bad")
    [first] = parse_tool_calls(two, TOOLS, 1)
    assert isinstance(first, ToolCall)
    assert len(parse_tool_calls(two, TOOLS, 2)) == 2
