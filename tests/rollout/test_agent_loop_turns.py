"""The agent loop's per-turn records (`Trajectory.turn_records`) and repeated-code count, with the
scripted engine and fake tool runner of test_agent_loop_layout.py."""
from test_agent_loop_layout import ANSWER, ScriptedEngine, call, roll, tiny_tok  # noqa: F401 (fixture)

from rstar2_cli.rollout.agent_loop import tool_status


async def test_turn_records_cover_the_response_with_code_and_status(tiny_tok):
    from test_agent_loop_layout import FakeRunner

    runner = FakeRunner(outputs={"boom()": ("", "NameError: boom", "runtime_error")})
    [t], engine, _ = await roll(tiny_tok, {"p#0": [call("boom()"), call("boom()"), call("print(6 * 7)"), ANSWER]},
                                runner=runner)
    turns = t.turn_records
    assert [x.role for x in turns] == ["assistant", "tool"] * 3 + ["assistant"]
    # the spans tile response_ids, and generated spans are exactly the loss-mask-1 runs
    assert turns[0].span[0] == 0 and turns[-1].span[1] == len(t.response_ids)
    assert all(a.span[1] == b.span[0] for a, b in zip(turns, turns[1:]))
    for x in turns:
        s, e = x.span
        assert set(t.loss_mask[s:e]) == {1 if x.role == "assistant" else 0}
    assert [x.tool_code for x in turns if x.role == "assistant"] == ["boom()", "boom()", "print(6 * 7)", None]
    assert [x.status for x in turns if x.role == "tool"] == ["error", "error", "ok"]
    assert all(x.parse_error is None for x in turns if x.role == "assistant")
    assert t.num_repeated_code_calls == 1           # the second boom() repeats the first


async def test_parse_error_is_recorded_on_its_turn(tiny_tok):
    broken = "Let me compute.</reason>\n<tool_call>\n{not json\n</tool_call><|im_end|>"
    [t], _, _ = await roll(tiny_tok, {"p#0": [broken, ANSWER]})
    first, tool = t.turn_records[:2]
    assert first.tool_code is None and first.parse_error
    assert tool.status == "parse_error"
    assert t.num_repeated_code_calls == 0


def test_tool_status_first_failure_decides():
    assert tool_status(["ok", "ok"]) == "ok"
    assert tool_status(["ok", "timeout", "runtime_error"]) == "timeout"
    assert tool_status(["internal_error"]) == "infra_error"
    assert tool_status(["memory"]) == "error"
    assert tool_status(["parse_error", "ok"]) == "parse_error"
