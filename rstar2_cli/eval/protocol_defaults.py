"""The evaluation protocol's defaults, written once: `EvalSettings`' fields take them, and so do the
`rstar2 eval` options (plain values, no pydantic: the CLI reads them when it starts, and
`rstar2 --help` imports no pydantic, cli.py). The protocol (avg@16, T = 0.6, 30K tokens, 30 turns)
is the paper's, as docs/eval.md states it."""
from __future__ import annotations

from typing import Any

EVAL_DEFAULTS: dict[str, Any] = {
    "samples": 16,              # k in avg@k
    "temperature": 0.6,
    "top_p": 0.95,
    "max_tokens": 30000,        # response budget, tool tokens included
    "max_turns": 30,
    "seed": 0,
    "answer_mode": "outcome",   # as reward.mode
    "engine": "vllm",
    "tools_in_prompt": True,
    "use_tools": True,
    "seed_requests": "auto",
}


def default_of(field: str) -> Any:
    """The protocol's default of the EvalSettings field `field`."""
    return EVAL_DEFAULTS[field]
