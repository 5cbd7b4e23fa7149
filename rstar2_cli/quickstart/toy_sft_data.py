"""SFT conversations for the toy task, with deliberately imperfect behaviour.

The SFT start must leave room for RL: if SFT taught perfect tool use there would be nothing to
learn. So the data mixes three behaviours, in fixed proportions (`BehaviourMix`):
  * guess: answer straight away with a plausible but (almost always) wrong number;
  * buggy then repair: a first call with a typo (an unclosed bracket), the sandbox's real
    SyntaxError, then the repaired call and the right answer;
  * correct tool use: one call, its output, the answer.
RL should learn to stop guessing (accuracy rises) and, with RoC, to stop making the typo that the
buggy-then-repair positives carry (tool-error ratio in positives falls). The repair route ends
right about as often as the clean one (see `_buggy_code`), so under plain GRPO, whose reward sees
only the outcome, the errors persist in positives: the paper's Fig. 4 setting.

Why no "right output, then a crash" route: the toy model copies the answer from a fixed distance
before `\\boxed{`, and an error text printed after the result moves it, so that route almost never
ended right at the SFT start (0 of 40 samples on seed 0) and plain GRPO removed it at once.

Tool responses are produced by running the code in the real sandbox and formatting the result
with the same function the agent loop uses, so SFT text matches RL rollouts byte for byte.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rstar2_cli.protocol.responses import response_text
from rstar2_cli.protocol.template import problem_messages
from rstar2_cli.protocol.tools import get_tools, tool_schemas
from rstar2_cli.quickstart.settings import TOY_PROTOCOL, QuickstartSettings
from rstar2_cli.quickstart.toy_task import ToyProblem

TOOL = "python_code_with_standard_io"


_DEFAULT = {
    name: QuickstartSettings.model_fields[f"mix_{name}"].default for name in ("guess", "buggy_repair", "correct")
}


@dataclass(frozen=True)
class BehaviourMix:
    """Route weights; the defaults are the quickstart settings' `mix_*` (one place, with its reason)."""
    guess: float = _DEFAULT["guess"]
    buggy_repair: float = _DEFAULT["buggy_repair"]
    correct: float = _DEFAULT["correct"]

    def pick(self, rng: random.Random) -> str:
        weights = [("guess", self.guess), ("buggy_repair", self.buggy_repair), ("correct", self.correct)]
        x = rng.random() * sum(w for _, w in weights)
        for name, w in weights:
            if x < w:
                return name
            x -= w
        return "correct"


def _call(code: str) -> dict[str, Any]:
    return {"name": TOOL, "arguments": {"code": code, "input": ""}}


def _wrong_guess(p: ToyProblem, rng: random.Random) -> int:
    true = int(p.answer)
    digits = list(str(true))
    for _ in range(rng.randint(1, 3)):               # perturb 1-3 digits: right size, wrong value
        i = rng.randrange(len(digits))
        digits[i] = str((int(digits[i]) + rng.randint(1, 9)) % 10)
    guess = int("".join(digits).lstrip("0") or "0")
    return guess if guess != true else true + rng.randint(1, 9)


def _buggy_code(p: ToyProblem) -> str:
    """The recoverable bug: the call forgets its closing bracket, a typo a programmer makes. The
    sandbox's real SyntaxError ends by echoing the line, so the repair copies the expression from
    the line right above it and closes the bracket; the repaired call's output is then laid out
    exactly like a clean call's. A tiny model copies by position, so every copy in this route (the
    expression from the problem, the repair from the echo, the answer from the output) is a copy
    at a fixed distance, and the route ends right about as often as a clean call does: plain
    GRPO, whose reward sees only the outcome, has little reason to drop the error; RoC, which
    prefers positives with fewer failed calls, does (the paper's Fig. 4 setting). In RL the model
    samples the typo itself; the sandbox runs whatever it wrote."""
    return f"print({p.expression}"                     # SyntaxError: '(' was never closed


def plan_conversation(p: ToyProblem, behaviour: str, rng: random.Random,
                      system_prompt: str | None = None) -> list[dict[str, Any]]:
    """Messages with `None` placeholders for tool outputs; `fill_tool_outputs` runs the code.

    `system_prompt` must be the RL recipe's `rollout.system_prompt` (None: the paper's), so the
    SFT conversations start with exactly the prompt the agent loop renders."""
    msgs = problem_messages(p.problem, system_prompt)
    good = f"print({p.expression})"
    if behaviour == "guess":
        g = _wrong_guess(p, rng)
        msgs.append({"role": "assistant",
                     "content": f"<reason>I can do this in my head.</reason>\n<answer>\\boxed{{{g}}}</answer>"})
        return msgs
    if behaviour == "buggy_repair":
        msgs.append({"role": "assistant", "content": "<reason>Let me compute it with Python.</reason>",
                     "tool_calls": [_call(_buggy_code(p))]})
        msgs.append({"role": "tool", "content": None})
        msgs.append({"role": "assistant", "content": "<reason>The code had a bug; fix it.</reason>",
                     "tool_calls": [_call(good)]})
    else:
        msgs.append({"role": "assistant", "content": "<reason>Let me compute it with Python.</reason>",
                     "tool_calls": [_call(good)]})
    msgs.append({"role": "tool", "content": None})
    msgs.append({"role": "assistant", "content": f"<answer>\\boxed{{{p.answer}}}</answer>"})
    return msgs


async def fill_tool_outputs(conversations: list[list[dict[str, Any]]], sandbox, max_chars: int) -> None:
    """Run every planned call in the sandbox and put the formatted output in its tool message."""
    slots: list[tuple[dict[str, Any], str]] = []
    for msgs in conversations:
        pending = None
        for m in msgs:
            if m["role"] == "assistant" and m.get("tool_calls"):
                pending = m["tool_calls"][0]["arguments"]["code"]
            elif m["role"] == "tool" and m["content"] is None:
                slots.append((m, pending))
    results = await sandbox.run_batch([{"code": code} for _, code in slots])
    for (m, _), r in zip(slots, results):
        m["content"] = response_text(r, max_chars, style=TOY_PROTOCOL["response_format"])


async def make_sft_rows(problems: list[ToyProblem], seed: int, sandbox, *, mix: BehaviourMix | None = None,
                        max_chars: int = 4096, system_prompt: str | None = None,
                        tools_in_prompt: bool = True) -> list[dict[str, Any]]:
    """One SFT conversation per problem: {"messages": [...], "tools": [...] | None, "behaviour": ...}.

    `system_prompt` / `tools_in_prompt` must equal the RL recipe's `rollout` settings: the SFT
    token layout then matches the agent loop's prompt exactly."""
    rng = random.Random(f"rstar2-toy-sft-{seed}")
    mix = mix or BehaviourMix()
    behaviours = [mix.pick(rng) for _ in problems]
    convs = [plan_conversation(p, b, rng, system_prompt) for p, b in zip(problems, behaviours)]
    await fill_tool_outputs(convs, sandbox, max_chars)
    schemas = tool_schemas(get_tools(TOOL)) if tools_in_prompt else None
    return [{"messages": c, "tools": schemas, "behaviour": b} for c, b in zip(convs, behaviours)]
