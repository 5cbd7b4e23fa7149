"""The agent protocol: prompt template, tool schemas, tool-call parser and tool-response turns."""
from rstar2_cli.protocol.parser import ParseError, ToolCall, format_tool_call, parse_tool_calls
from rstar2_cli.protocol.responses import (format_run_result, response_text, tool_turn_ids,
                                           tool_turn_text, truncate_middle)
from rstar2_cli.protocol.template import (USER_PROMPT, chat_template, encode_messages, eos_token_ids,
                                          install_chat_template, problem_messages, render_messages,
                                          single_token_id)
from rstar2_cli.protocol.tools import (PYTHON_CODE_WITH_STANDARD_IO, PYTHON_NOTEBOOK, TOOLS, ToolSpec,
                                       get_tools, tool_schemas)

__all__ = [
    "ParseError", "ToolCall", "format_tool_call", "parse_tool_calls",
    "format_run_result", "response_text", "tool_turn_ids", "tool_turn_text", "truncate_middle",
    "USER_PROMPT", "chat_template", "encode_messages", "eos_token_ids", "install_chat_template",
    "problem_messages", "render_messages", "single_token_id",
    "PYTHON_CODE_WITH_STANDARD_IO", "PYTHON_NOTEBOOK", "TOOLS", "ToolSpec", "get_tools", "tool_schemas",
]
