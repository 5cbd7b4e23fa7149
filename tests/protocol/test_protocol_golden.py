"""Golden bytes: what our agent loop feeds the model equals what the official release fed it.

The release side is emulated from its own text (fixtures/): its chat template installed on the
tokenizer, its tool schema, and its agent loop's arithmetic (rstar2_agent/rollout/
rstar2_agent_loop.py on verl's ToolAgentLoop): the prompt is `apply_chat_template(messages,
tools, add_generation_prompt=True)`; the sampled ids (ending on `<|im_end|>`) are appended as
they are; a tool turn is `apply_chat_template(tool_messages, add_generation_prompt=True)` minus
the first `len(apply_chat_template([{}]))` ids (the system block). Our side is the real agent
loop with a scripted engine. Both run on a tokenizer with Qwen3's conventions.
"""
import asyncio
import copy
import json
from pathlib import Path

import pytest

from rstar2_cli.config import RolloutConfig
from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol import format_tool_call, get_tools, tool_schemas
from rstar2_cli.protocol.code_runner import release_runner_source
from rstar2_cli.protocol.template import FORCED_REASON, SYSTEM_PROMPT, USER_PROMPT
from rstar2_cli.rollout.agent_loop import run_agent_loop
from rstar2_cli.rollout.engines import GenResult
from sandbox.core.result import RunResult

FIXTURES = Path(__file__).parent / "fixtures"
RELEASE_TEMPLATE = (FIXTURES / "release_chat_template.jinja").read_text()
RELEASE_SCHEMA = json.loads((FIXTURES / "release_tool_schema.json").read_text())
PROBLEM = "What is $6 \\times 7$?"
CALL = format_tool_call("python_code_with_standard_io", {"code": "print(6 * 7)", "input": ""})
TURN1 = f"I will compute it.</reason>\n<tool_call>\n{CALL}\n</tool_call><|im_end|>"
TURN2 = "The tool says 42.</reason>\n<answer>The answer is $\\boxed{42}$.</answer><|im_end|>"
TOOL_TEXT = "Tool call success\nstdout: 42\n\nexecution time: 0.03s"   # the release's words for this run


@pytest.fixture(scope="module", params=["qwen3_style", "tiny"])
def tok(request):
    return build_qwen3_style_tokenizer() if request.param == "qwen3_style" else build_tokenizer(default_corpus(0), 512)


def _ids(out):
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def release_sequence(tok) -> tuple[list[int], list[int], str]:
    """(prompt ids, response ids, response mask as a string of 0/1) the release builds for the
    conversation problem -> call -> result -> answer."""
    rel = copy.deepcopy(tok)
    rel.chat_template = RELEASE_TEMPLATE
    prompt = _ids(rel.apply_chat_template([{"role": "user", "content": PROBLEM}], tools=[RELEASE_SCHEMA],
                                          add_generation_prompt=True, tokenize=True))
    system_prompt = _ids(rel.apply_chat_template([{}], add_generation_prompt=False, tokenize=True))
    tool = _ids(rel.apply_chat_template([{"role": "tool", "content": TOOL_TEXT}], add_generation_prompt=True,
                                        tokenize=True))[len(system_prompt):]
    gen1, gen2 = (tok.encode(t, add_special_tokens=False) for t in (TURN1, TURN2))
    return prompt, gen1 + tool + gen2, "1" * len(gen1) + "0" * len(tool) + "1" * len(gen2)


class _Script:
    """Returns the scripted turns' ids, each ending on the stop id it ends with."""

    def __init__(self, tok):
        self.turns = [tok.encode(t, add_special_tokens=False) for t in (TURN1, TURN2)]

    async def generate(self, req, key=None):
        ids = self.turns.pop(0)
        assert ids[-1] in req.stop_token_ids and len(ids) <= req.max_tokens
        return GenResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", stop_token_id=ids[-1])


class _Runner:
    async def run_batch(self, items, timeout=None):
        # the release's executor around the snippet, and its 4 s limit
        assert [it["code"] for it in items] == [release_runner_source("print(6 * 7)")] and timeout == 4.0
        return [RunResult(stdout="42\n", stderr="", exit_code=0, wall_time=0.031, reason="ok")]


def our_trajectory(tok):
    [t] = asyncio.run(run_agent_loop([("p", PROBLEM, "42")], 1, _Script(tok), _Runner(), tok, RolloutConfig(),
                                     progress=False))
    return t


def test_release_prompt_bytes_hold_the_release_system_prompt_and_tools(tok):
    prompt, _, _ = release_sequence(tok)
    text = tok.decode(prompt, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "\n\n# Tools\n")
    assert "<reason> reasoning process here </reason> <answer> answer here </answer>." in text
    assert '"return"' not in text
    assert text.endswith(USER_PROMPT.format(problem=PROBLEM) + "<|im_end|>\n<|im_start|>assistant\n" + FORCED_REASON)


def test_default_trajectory_is_the_releases_byte_for_byte(tok):
    prompt, response, mask = release_sequence(tok)
    t = our_trajectory(tok)
    assert t.finish_reason == "stop" and t.num_turns == 2 and t.num_tool_calls == 1
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)   # noqa: E731
    assert decode(t.prompt_ids) == decode(prompt)                       # strings first: readable diffs
    assert decode(t.response_ids) == decode(response)
    assert t.prompt_ids == prompt and t.response_ids == response       # then the token ids
    assert "".join(map(str, t.loss_mask)) == mask


def test_forced_reason_after_the_tool_turn_is_template_text(tok):
    """The `<reason>` that opens turn 2 is in the tool turn: mask 0, logprob 0.0."""
    t = our_trajectory(tok)
    n1 = len(tok.encode(TURN1, add_special_tokens=False))
    n2 = len(tok.encode(TURN2, add_special_tokens=False))
    tool_part = slice(n1, len(t.response_ids) - n2)
    assert tok.decode(t.response_ids[tool_part], skip_special_tokens=False).endswith(
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>")
    assert set(t.loss_mask[tool_part]) == {0} and set(t.logprobs[tool_part]) == {0.0}
    assert set(t.loss_mask[:n1]) == {1} and set(t.loss_mask[-n2:]) == {1}


def test_our_schema_is_the_releases_and_return_is_opt_in():
    ours = tool_schemas(get_tools("python_code_with_standard_io"))
    assert json.dumps(ours[0]) == json.dumps(RELEASE_SCHEMA)            # same keys, same order
    with_return = tool_schemas(get_tools("python_code_with_standard_io"), include_return=True)[0]
    assert with_return["function"]["return"]["type"] == "string"
