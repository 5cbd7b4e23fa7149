"""The agent loop's exact fast paths (protocol/detokenize.py, protocol/splice.py): a rollout
renders the chat template once per shape of tool turn, not once per tool turn; maps each response
id to text once (no second decode of the whole response); and gives the trajectories the
whole-render, whole-decode path gives (tool spans and text; the layout tests compare whole
trajectories), with a turn that ends inside a character's bytes too. The samples of a problem share
its prompt list."""
from __future__ import annotations

import asyncio

import pytest
from test_agent_loop_layout import ANSWER, FakeRunner, call, roll

import rstar2_cli.protocol.responses as responses
from rstar2_cli.config import RolloutConfig
from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol.detokenize import ByteDecoder
from rstar2_cli.protocol.responses import tool_turn_ids
from rstar2_cli.protocol.splice import PROBES
from rstar2_cli.rollout.agent_loop import run_agent_loop
from rstar2_cli.rollout.engines import GenResult
from sandbox.core.result import RunResult


@pytest.fixture(scope="module", params=["tiny", "qwen3_style"])
def tok(request):
    if request.param == "tiny":
        return build_tokenizer(default_corpus(0), 512)
    return build_qwen3_style_tokenizer()


def whole_decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


async def test_tool_turns_render_once_per_shape_and_ids_are_decoded_once(tok, monkeypatch):
    renders, mapped = [], []
    render, raw, decode = responses.render_messages, ByteDecoder.raw, ByteDecoder.__call__
    monkeypatch.setattr(responses, "render_messages", lambda *a, **k: renders.append(1) or render(*a, **k))
    monkeypatch.setattr(ByteDecoder, "raw", lambda self, ids: mapped.append(len(ids)) or raw(self, ids))
    monkeypatch.setattr(ByteDecoder, "__call__", lambda self, ids: mapped.append(len(ids)) or decode(self, ids))
    outputs = {f"print({i})": (f"{i} é\n" * i, "", "ok") for i in range(24)}
    script = {f"p{i}#0": [call(f"print({i})"), call(f"print({i + 1})"), ANSWER] for i in range(12)}
    trajs, _, _ = await roll(tok, script, FakeRunner(outputs))
    assert sum(t.num_tool_calls for t in trajs) == 24
    assert len(renders) == 1 + len(PROBES)     # one shape: its stand-in render and its probes
    assert sum(mapped) == sum(len(t.response_ids) for t in trajs)
    for t in trajs:
        assert t.text == whole_decode(tok, t.response_ids)
        code = t.turn_records[0].tool_code
        run = RunResult(stdout=outputs[code][0], stderr="", exit_code=0, wall_time=0.01, reason="ok")
        start, end = t.turn_records[1].span
        assert t.response_ids[start:end] == tool_turn_ids(tok, [responses.release_run_text(run)])


class SplitCharEngine:
    """Turn 1 ends on the first byte of a two-byte character (then a call and <|im_end|>), turn 2
    starts with its second byte: per-turn text and the whole text both hold replacement characters."""

    def __init__(self, tok):
        self.tok = tok
        self.turns: dict[str, int] = {}
        byte = {b: i for i in range(len(tok)) if len(b := tok.convert_ids_to_tokens(i)) == 1}
        self.first, self.second = byte["Ã"], byte["©"]     # é is C3 A9; GPT-2's alphabet spells them Ã, ©

    async def generate(self, req, key=None):
        await asyncio.sleep(0)
        n = self.turns[key] = self.turns.get(key, -1) + 1
        text = call() if n == 0 else ANSWER
        ids = ([self.first] if n == 0 else [self.second]) + self.tok.encode(text, add_special_tokens=False)
        return GenResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", stop_token_id=ids[-1])


async def test_a_turn_cut_inside_a_character_decodes_as_the_whole(tok):
    trajs = await run_agent_loop([("p", "What is 6*7?", "42")], 2, SplitCharEngine(tok), FakeRunner(), tok,
                                 RolloutConfig(code_runner="plain"), progress=False)
    for t in trajs:
        assert t.num_tool_calls == 1 and t.text == whole_decode(tok, t.response_ids) and "\ufffd" in t.text


async def test_the_samples_of_a_problem_share_one_prompt_list(tok):
    """One prompt list per problem instance (not a copy per sample: fewer lists for every full garbage
    collection to walk while a step's trajectories live), with the template's ids."""
    script = {f"p{i}#{k}": [ANSWER] for i in range(2) for k in range(3)}
    trajs, _, _ = await roll(tok, script, samples=3)
    assert [t.prompt_id for t in trajs] == ["p0"] * 3 + ["p1"] * 3
    assert trajs[0].prompt_ids is trajs[1].prompt_ids is trajs[2].prompt_ids
    assert trajs[3].prompt_ids is not trajs[0].prompt_ids and trajs[3].prompt_ids == trajs[0].prompt_ids
