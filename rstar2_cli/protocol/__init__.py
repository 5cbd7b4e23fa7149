"""The agent protocol: prompt template, tool schemas, tool-call parser, code runner and
tool-response turns. Defaults reproduce the official release byte for byte (docs/fidelity.md)."""
from rstar2_cli.protocol.code_runner import release_runner_source
from rstar2_cli.protocol.parser import ParseError, ToolCall, format_tool_call, parse_tool_calls
from rstar2_cli.protocol.responses import (format_run_result, release_run_text, response_text, tool_turn_ids,
                                           tool_turn_text, truncate_middle, truncate_release)
from rstar2_cli.protocol.template import (FORCED_REASON, SYSTEM_PROMPT, USER_PROMPT, chat_template, encode_messages,
                                          eos_token_ids, install_chat_template, problem_messages, render_messages,
                                          single_token_id)
from rstar2_cli.protocol.tools import (PYTHON_CODE_WITH_STANDARD_IO, PYTHON_NOTEBOOK, TOOLS, ToolSpec,
                                       get_tools, tool_schemas)

__all__ = [
    "release_runner_source",
    "ParseError", "ToolCall", "format_tool_call", "parse_tool_calls",
    "format_run_result", "release_run_text", "response_text", "tool_turn_ids", "tool_turn_text",
    "truncate_middle", "truncate_release",
    "FORCED_REASON", "SYSTEM_PROMPT", "USER_PROMPT", "chat_template", "encode_messages", "eos_token_ids",
    "install_chat_template", "problem_messages", "render_messages", "single_token_id",
    "PYTHON_CODE_WITH_STANDARD_IO", "PYTHON_NOTEBOOK", "TOOLS", "ToolSpec", "get_tools", "tool_schemas",
]
