"""The tools the policy may call, as the JSON schemas shown in its prompt.

Why a registry with schemas and not bare functions: the same definition is rendered into the
prompt (`<tools>` block), used by the parser to validate a call's arguments, and turned into a
sandbox request. Keeping the three in one record means the model is never told about an argument
the runner ignores, or validated against a schema it was never shown.

`python_code_with_standard_io` is the official rStar2-Agent tool (code + stdin, stateless: each
call is a fresh interpreter). `python_notebook` is our stateful variant: calls of one trajectory
run in one sandbox session, so variables persist like Jupyter cells.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rstar2_cli.protocol.code_runner import release_runner_source

_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": dict, "array": list}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: Mapping[str, Any]              # JSON schema of the arguments object
    returns: Mapping[str, Any] | None = None   # the paper's Fig. 3 "return" object (the release's has none)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # filled when an optional arg is omitted
    stateful: bool = False                     # True: calls of one trajectory share a session

    def schema(self, include_return: bool = False) -> dict[str, Any]:
        """The OpenAI/Hermes function schema, as rendered inside `<tools></tools>`: the release's
        (name, description, parameters), plus the paper's "return" object with `include_return`."""
        fn: dict[str, Any] = {"name": self.name, "description": self.description,
                              "parameters": dict(self.parameters)}
        if include_return and self.returns is not None:
            fn["return"] = dict(self.returns)
        return {"type": "function", "function": fn}

    def check_arguments(self, arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
        """(arguments with defaults filled, None) or (None, a short error the model can learn from)."""
        if not isinstance(arguments, dict):
            return None, (f'Error: "arguments" of tool "{self.name}" must be a JSON object, '
                          f"got {_json_type_name(arguments)}.")
        props: Mapping[str, Any] = self.parameters.get("properties", {})
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return None, (f'Error: tool "{self.name}" got unexpected argument "{unknown[0]}"; '
                          f"its arguments are: {', '.join(props)}.")
        filled = {**self.defaults, **arguments}
        for name in self.parameters.get("required", []):
            if name not in filled:
                return None, f'Error: tool "{self.name}" is missing required argument "{name}".'
        for name, value in filled.items():
            want = props[name].get("type")
            if want in _JSON_TYPES and (not isinstance(value, _JSON_TYPES[want])
                                        or (want != "boolean" and isinstance(value, bool))):
                return None, (f'Error: argument "{name}" of tool "{self.name}" must be a {want}, '
                              f"got {_json_type_name(value)}.")
        return filled, None

    def run_item(self, arguments: Mapping[str, Any], session: str | None,
                 code_runner: str = "plain") -> dict[str, Any]:
        """A sandbox `run_batch` item for validated arguments. `code_runner` "release" wraps a
        stateless snippet in the release's executor semantics (protocol/code_runner.py)."""
        if self.stateful:
            return {"code": arguments["code"], "stdin": None, "session": session}
        code = arguments["code"]
        if code_runner == "release":
            code = release_runner_source(code)
        return {"code": code, "stdin": arguments.get("input") or None, "session": None}


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    for name, typ in (("string", str), ("integer", int), ("number", float), ("object", dict), ("array", list)):
        if isinstance(value, typ):
            return name
    return type(value).__name__


# The official schema: the release's rstar2_agent/config/tool_config/python_tool_config.yaml (the
# paper's Fig. 3 calls it "execute_python_code_with_standard_io" and adds a "return" object).
PYTHON_CODE_WITH_STANDARD_IO = ToolSpec(
    name="python_code_with_standard_io",
    description=(
        "Execute Python code with standard input and capture standard output. This function takes a "
        "Python code string and an input string, provides the input string through standard input "
        "(stdin) to the code, and captures and returns any output produced through standard output "
        "(stdout). If the executed code raises an exception, the error message will be captured and "
        "returned instead."
    ),
    parameters={
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": (
                "A string containing Python code to be executed. The code can read from standard "
                "input using the input() function.")},
            "input": {"type": "string", "description": (
                "A string that will be provided as standard input to the code when it calls input().")},
        },
        "required": ["code", "input"],
    },
    returns={"type": "string", "description": (
        "str: The output produced by the executed code through standard output. If an error occurs "
        "during execution, the error message will be returned.")},
    # The release's runner reads `input` with a default of "": a call without it still runs.
    defaults={"input": ""},
)

PYTHON_NOTEBOOK = ToolSpec(
    name="python_notebook",
    description=(
        "Execute Python code in a persistent notebook session, like a Jupyter cell: variables, "
        "functions and imports defined by earlier calls stay available. Returns what the code prints "
        "to standard output; if it prints nothing, the value of the last expression, as IPython shows it. "
        "If the code raises an exception, the error message is returned instead."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python code to run in the session."}},
        "required": ["code"],
    },
    returns={
        "type": "string",
        "description": "str: the printed output (else the last expression's value), or the error.",
    },
    stateful=True,
)

TOOLS: dict[str, ToolSpec] = {t.name: t for t in (PYTHON_CODE_WITH_STANDARD_IO, PYTHON_NOTEBOOK)}


def get_tools(*names: str) -> dict[str, ToolSpec]:
    """The named tools (as a name -> spec mapping for the parser); a clear error for an unknown name."""
    out = {}
    for name in names:
        if name not in TOOLS:
            raise ValueError(f"unknown tool {name!r}; known tools: {', '.join(TOOLS)}")
        out[name] = TOOLS[name]
    return out


def tool_schemas(tools: Mapping[str, ToolSpec], include_return: bool = False) -> list[dict[str, Any]]:
    """The `tools=` argument of `apply_chat_template` (`include_return`: rollout.tool_schema_return)."""
    return [t.schema(include_return) for t in tools.values()]
