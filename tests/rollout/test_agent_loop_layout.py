"""The agent loop's token layout, stop reasons and asynchronous tool dispatch, with a scripted
engine (predetermined token ids) and a fake tool runner (no sandbox, no model). The default
protocol is the release's: a turn ends on <|im_end|>, the forced <reason> is template text, tool
results read "Tool call success ..." (the golden comparison is tests/protocol/test_protocol_golden.py)."""
import asyncio

import pytest

from rstar2_cli.config import RolloutConfig
from rstar2_cli.models.tiny import build_qwen3_style_tokenizer, build_tokenizer, default_corpus
from rstar2_cli.protocol import (encode_messages, format_tool_call, get_tools, problem_messages, tool_schemas,
                                 tool_turn_ids)
from rstar2_cli.protocol.code_runner import release_runner_source
from rstar2_cli.rollout.agent_loop import run_agent_loop, trajectory_seed
from rstar2_cli.rollout.engines import GenResult
from rstar2_cli.rollout.generation import EngineRequestError
from sandbox.core.result import RunResult

STDIO = tool_schemas(get_tools("python_code_with_standard_io"))
PROBLEM = "What is 6*7?"


def call(code="print(6 * 7)", name="python_code_with_standard_io", end="<|im_end|>", **extra):
    """A generated turn with one call; the prompt's forced <reason> opened it, the policy ends it."""
    args = {"code": code, **({"input": ""} if name == "python_code_with_standard_io" else {}), **extra}
    return f"Let me compute.</reason>\n<tool_call>\n{format_tool_call(name, args)}\n</tool_call>{end}"


ANSWER = "It is 42.</reason>\n<answer>The answer is $\\boxed{42}$.</answer><|im_end|>"
OK_42 = "Tool call success\nstdout: 42\n\nexecution time: 0.01s"   # FakeRunner's default run, release words


class ScriptedEngine:
    """Emits the token ids of scripted turn texts, stopping at the first stop id like vLLM."""

    def __init__(self, tok, script: dict[str, list[str]], fail_keys=()):
        self.tok, self.script, self.fail_keys = tok, {k: list(v) for k, v in script.items()}, set(fail_keys)
        self.requests: list[tuple[str, object]] = []
        self.second_turn_seen: dict[str, asyncio.Event] = {}

    def turn_ids(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    async def generate(self, req, key=None):
        self.requests.append((key, req))
        if key in self.fail_keys:
            raise EngineRequestError("engine down")
        turn = sum(k == key for k, _ in self.requests) - 1
        if turn == 1 and key in self.second_turn_seen:
            self.second_turn_seen[key].set()
        await asyncio.sleep(0)
        ids, finish, stop = [], "length", None
        for i in self.turn_ids(self.script[key].pop(0)):
            if len(ids) == req.max_tokens:
                break
            ids.append(i)
            if i in req.stop_token_ids:
                finish, stop = "stop", i
                break
        return GenResult(token_ids=ids, logprobs=[-(turn + 1) - j / 1000 for j in range(len(ids))],
                         finish_reason=finish, stop_token_id=stop)


class FakeRunner:
    """Answers every call with `outputs[code]`; records calls; optional per-code gates."""

    def __init__(self, outputs=None, gates=None):
        self.outputs, self.gates = outputs or {}, gates or {}
        self.batches: list[tuple[list[dict], float | None]] = []
        self.closed: list[str] = []

    async def run_batch(self, items, timeout=None):
        self.batches.append((items, timeout))
        out = []
        for it in items:
            if it["code"] in self.gates:
                await asyncio.wait_for(self.gates[it["code"]].wait(), timeout=10)
            stdout, stderr, reason = self.outputs.get(it["code"], ("42\n", "", "ok"))
            out.append(RunResult(stdout=stdout, stderr=stderr, exit_code=0 if reason == "ok" else 1,
                                 wall_time=0.01, reason=reason))
        return out

    def close_session(self, session):
        self.closed.append(session)


@pytest.fixture(scope="module")
def tiny_tok():
    return build_tokenizer(default_corpus(0), 512)


def cfg(**kw):
    # code_runner "plain": the fake runner keys outputs by the snippet as written (the release's
    # wrapper is checked on its own below and in tests/protocol/test_protocol_code_runner.py)
    return RolloutConfig(**{"max_turns": 10, "max_response_tokens": 4096, "code_runner": "plain", **kw})


async def roll(tok, script, runner=None, progress=False, samples=1, seed=0, engine=None, **kw):
    problems = sorted({(k.split("#")[0], PROBLEM, "42") for k in script})
    engine = engine or ScriptedEngine(tok, script)
    runner = runner or FakeRunner()
    trajs = await run_agent_loop(problems, samples, engine, runner, tok, cfg(**kw), seed=seed, progress=progress)
    return trajs, engine, runner


@pytest.mark.parametrize("which", ["tiny", "qwen3_style"])
async def test_token_and_mask_layout_across_turns(which, tiny_tok):
    tok = tiny_tok if which == "tiny" else build_qwen3_style_tokenizer()
    [t], engine, runner = await roll(tok, {"p#0": [call(), ANSWER]}, progress=True)
    prompt = encode_messages(tok, problem_messages(PROBLEM), STDIO, add_generation_prompt=True)
    gen1, gen2 = engine.turn_ids(call()), engine.turn_ids(ANSWER)
    tool = tool_turn_ids(tok, [OK_42])
    assert t.prompt_ids == prompt
    assert t.response_ids == gen1 + tool + gen2
    assert t.loss_mask == [1] * len(gen1) + [0] * len(tool) + [1] * len(gen2)
    assert t.logprobs[:len(gen1)] == [-1 - j / 1000 for j in range(len(gen1))]
    assert t.logprobs[len(gen1):len(gen1) + len(tool)] == [0.0] * len(tool)
    assert t.logprobs[-len(gen2):] == [-2 - j / 1000 for j in range(len(gen2))]
    # the whole trajectory is exactly the template's render of the conversation
    convo = problem_messages(PROBLEM) + [{"role": "assistant", "content": call().removesuffix("<|im_end|>")},
                                         {"role": "tool", "content": OK_42},
                                         {"role": "assistant", "content": ANSWER.removesuffix("<|im_end|>")}]
    assert t.prompt_ids + t.response_ids + tok.encode("\n", add_special_tokens=False) == encode_messages(
        tok, convo, STDIO
    )
    assert (t.finish_reason, t.num_turns, t.num_tool_calls, t.num_tool_errors) == ("stop", 2, 1, 0)
    assert t.text == tok.decode(t.response_ids, skip_special_tokens=False) and "\\boxed{42}" in t.text
    # what the engine and the runner were asked
    (_, r1), (_, r2) = engine.requests
    assert r2.prompt_ids == prompt + gen1 + tool and r2.max_tokens == 4096 - len(gen1) - len(tool)
    vocab = tok.get_vocab()
    assert vocab["<|im_end|>"] in r1.stop_token_ids and vocab["</tool_call>"] not in r1.stop_token_ids
    assert r1.seed != r2.seed
    assert runner.batches == [([{"code": "print(6 * 7)", "stdin": None, "session": None}], 4.0)]


async def test_stop_at_tool_call_writes_the_im_end_itself(tiny_tok):
    """rollout.stop_at_tool_call: the turn stops at </tool_call>; the loop adds <|im_end|> (mask 0),
    so the bytes are the default layout's and only who wrote <|im_end|> differs."""
    [t], engine, _ = await roll(tiny_tok, {"p#0": [call(end=""), ANSWER]}, stop_at_tool_call=True)
    gen1 = engine.turn_ids(call(end=""))
    tool = tool_turn_ids(tiny_tok, [OK_42], after_eos=False)
    assert t.response_ids[:len(gen1) + len(tool)] == gen1 + tool and tool[0] == tiny_tok.get_vocab()["<|im_end|>"]
    assert t.loss_mask[len(gen1)] == 0
    [default], _, _ = await roll(tiny_tok, {"p#0": [call(), ANSWER]})
    assert t.response_ids == default.response_ids


async def test_without_forced_reason_turns_open_on_the_bare_header(tiny_tok):
    [t], _, _ = await roll(tiny_tok, {"p#0": [call(), ANSWER]}, force_reason=False)
    assert tiny_tok.decode(t.prompt_ids).endswith("<|im_start|>assistant\n")
    assert "</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 42." in t.text


async def test_by_default_a_snippet_is_sent_in_the_releases_executor(tiny_tok):
    [t], _, runner = await roll(tiny_tok, {"p#0": [call(), ANSWER]}, code_runner="release")
    [([item], _)] = runner.batches
    assert item["code"] == release_runner_source("print(6 * 7)") and RolloutConfig().code_runner == "release"


@pytest.mark.parametrize("messages, bad_json_says, unknown_says", [
    ("release", "Failed to decode tool call: ", "Error when executing tool: 'python_notebook'"),
    ("strict", "not valid JSON", 'unknown tool "python_notebook"')])
async def test_parse_errors_are_answered_not_run(tiny_tok, messages, bad_json_says, unknown_says):
    bad_json = '<tool_call>\n{"name": "python_code_with_standard_io", "arguments": {\n</tool_call><|im_end|>'
    unknown = call(name="python_notebook")
    [t], _, runner = await roll(tiny_tok, {"p#0": [bad_json, unknown, ANSWER]}, parse_messages=messages)
    assert runner.batches == []
    assert (t.num_tool_calls, t.num_tool_errors, t.tool_outcomes) == (2, 2, ["parse_error"] * 2)
    assert bad_json_says in t.text and unknown_says in t.text
    assert t.finish_reason == "stop"


async def test_failed_runs_count_as_tool_errors_and_long_output_is_middle_cut(tiny_tok):
    runner = FakeRunner({"1/0": ("", "Traceback\nZeroDivisionError: division by zero\n", "runtime_error"),
                         "print('x' * 9000)": ("x" * 9000, "", "ok")})
    script = {"p#0": [call("1/0"), call("print('x' * 9000)"), ANSWER]}
    [t], _, _ = await roll(tiny_tok, script, runner, tool_response_max_chars=200)
    assert t.tool_outcomes == ["runtime_error", "ok"] and t.num_tool_errors == 1
    assert "Tool call failure\nreason: \nstderr: Traceback\nZeroDivisionError: division by zero\n" in t.text
    assert (
        "Tool call success\nstdout: " + "x" * 74 + "...(truncated)..." + "x" * 78 + "\nexecution time: 0.01s" in t.text
    )
    [ours], _, _ = await roll(tiny_tok, {k: list(v) for k, v in script.items()}, runner, tool_response_max_chars=200,
                              response_format="rstar2")
    assert "characters truncated]" in ours.text and "x" * 200 not in ours.text


async def test_max_turns_stops_without_running_the_last_turns_calls(tiny_tok):
    [t], engine, runner = await roll(tiny_tok, {"p#0": [call("a=1"), call("b=2"), ANSWER]}, max_turns=2)
    assert (t.finish_reason, t.num_turns, t.num_tool_calls) == ("max_turns", 2, 1)
    assert [b[0][0]["code"] for b in runner.batches] == ["a=1"]
    assert t.response_ids[-len(engine.turn_ids(call("b=2"))):] == engine.turn_ids(call("b=2"))


async def test_length_inside_a_generated_turn(tiny_tok):
    [t], engine, _ = await roll(tiny_tok, {"p#0": [call()]}, max_response_tokens=10)
    assert t.finish_reason == "length" and t.response_ids == engine.turn_ids(call())[:10]
    assert t.loss_mask == [1] * 10 and t.num_tool_calls == 0


async def test_a_tool_turn_that_does_not_fit_the_budget_ends_the_trajectory_unappended(tiny_tok):
    """The release's rule: no partial tool turn (and none that would leave no room to answer)."""
    engine = ScriptedEngine(tiny_tok, {"p#0": [call(), ANSWER]})
    gen1, tool = engine.turn_ids(call()), tool_turn_ids(tiny_tok, [OK_42])
    [t], _, runner = await roll(tiny_tok, {"p#0": [call(), ANSWER]}, engine=engine,
                                max_response_tokens=len(gen1) + len(tool))
    assert t.finish_reason == "length" and t.response_ids == gen1 and t.loss_mask == [1] * len(gen1)
    assert len(runner.batches) == 1 and len(engine.requests) == 1


async def test_an_unclosed_call_ends_the_trajectory_unless_unclosed_tag_feedback(tiny_tok):
    unclosed = 'try</reason>\n<tool_call>\n{"name": "python_code_with_standard_io"<|im_end|>'
    [t], _, runner = await roll(tiny_tok, {"p#0": [unclosed, ANSWER]})
    assert (t.finish_reason, t.num_turns, t.num_tool_calls, runner.batches) == ("stop", 1, 0, [])
    [t], engine, runner = await roll(tiny_tok, {"p#0": [unclosed, ANSWER]}, unclosed_tag_feedback=True)
    gen1 = engine.turn_ids(unclosed)
    tool = t.response_ids[len(gen1):len(t.response_ids) - len(engine.turn_ids(ANSWER))]
    assert tool == tool_turn_ids(tiny_tok, ["Error: <tool_call> was not closed with </tool_call>."])
    assert t.num_tool_errors == 1 and t.finish_reason == "stop"
    convo = problem_messages(PROBLEM) + [
        {"role": "assistant", "content": unclosed.removesuffix("<|im_end|>")},
        {"role": "tool", "content": "Error: <tool_call> was not closed with </tool_call>."},
        {"role": "assistant", "content": ANSWER.removesuffix("<|im_end|>")}]
    assert t.prompt_ids + t.response_ids + tiny_tok.encode("\n") == encode_messages(tiny_tok, convo, STDIO)


async def test_end_of_text_ends_the_trajectory_even_after_a_broken_call(tiny_tok):
    [t], _, runner = await roll(tiny_tok, {"p#0": ["<tool_call>\n{<|endoftext|>"]})
    assert t.finish_reason == "stop" and t.num_tool_calls == 0 and runner.batches == []


async def test_tool_calls_are_dispatched_while_other_trajectories_generate(tiny_tok):
    """a's tool call cannot finish until b's second turn has been requested: only a loop that runs
    trajectories concurrently (not in lock-step turns) completes."""
    script = {"a#0": [call("slow()"), ANSWER], "b#0": [call("fast()"), ANSWER]}
    engine = ScriptedEngine(tiny_tok, script)
    engine.second_turn_seen["b#0"] = asyncio.Event()
    runner = FakeRunner(gates={"slow()": engine.second_turn_seen["b#0"]})
    trajs, _, _ = await roll(tiny_tok, script, runner, engine=engine)
    assert [t.finish_reason for t in trajs] == ["stop", "stop"]
    order = [k for k, _ in engine.requests]
    assert order.index("b#0", order.index("b#0") + 1) < order.index("a#0", order.index("a#0") + 1)


async def test_notebook_calls_share_the_trajectory_session_which_is_closed_after(tiny_tok):
    nb = lambda code: call(code, name="python_notebook")  # noqa: E731
    [t], _, runner = await roll(tiny_tok, {"p#0": [nb("x = 6"), nb("print(x * 7)"), ANSWER]}, tool="python_notebook")
    assert [b[0][0] for b in runner.batches] == [{"code": "x = 6", "stdin": None, "session": "p#0"},
                                                 {"code": "print(x * 7)", "stdin": None, "session": "p#0"}]
    assert runner.closed == ["p#0"] and 'python_notebook' in tiny_tok.decode(t.prompt_ids)


async def test_a_failing_trajectory_is_marked_error_and_the_rest_complete(tiny_tok):
    script = {"bad#0": [ANSWER], "good#0": [ANSWER]}
    engine = ScriptedEngine(tiny_tok, script, fail_keys={"bad#0"})
    trajs, _, _ = await roll(tiny_tok, script, engine=engine)
    assert [(t.prompt_id, t.finish_reason) for t in trajs] == [("bad", "error"), ("good", "stop")]
    assert "engine down" in trajs[0].error
    with pytest.raises(RuntimeError, match="all 1 trajectories failed.*engine down"):
        await roll(tiny_tok, {"bad#0": [ANSWER]}, engine=ScriptedEngine(tiny_tok, {"bad#0": [ANSWER]}, {"bad#0"}))


async def test_keys_and_seeds_are_per_trajectory_and_reproducible(tiny_tok):
    def script():
        return {f"p#{k}": [ANSWER] for k in range(3)}
    trajs, e1, _ = await roll(tiny_tok, script(), samples=3, seed=7)
    _, e2, _ = await roll(tiny_tok, script(), samples=3, seed=7)
    _, e3, _ = await roll(tiny_tok, script(), samples=3, seed=8)
    assert [(t.prompt_id, t.sample_index, t.instance_key) for t in trajs] == [("p", k, f"p#{k}") for k in range(3)]
    seeds = lambda e: sorted((k, r.seed) for k, r in e.requests)  # noqa: E731
    assert seeds(e1) == seeds(e2) != seeds(e3)
    assert len({s for _, s in seeds(e1)}) == 3
    assert trajs[0].sampling_seed == trajectory_seed(7, "p", 0)


async def test_with_the_real_sandbox_notebook_state_persists_and_errors_are_counted(tiny_tok):
    from sandbox import Limits, Sandbox
    nb = lambda code: call(code, name="python_notebook")  # noqa: E731
    script = {"p#0": [nb("x = 6"), nb("print(x * 7)"), nb("1/0"), ANSWER]}
    async with Sandbox(workers=1, limits=Limits(timeout=5)) as sb:
        [t], _, _ = await roll(tiny_tok, script, runner=sb, tool="python_notebook")
    assert t.tool_outcomes == ["ok", "ok", "runtime_error"] and t.num_tool_errors == 1
    responses = [seg.split("\n</tool_response>")[0] for seg in t.text.split("<tool_response>\n")[1:]]
    assert responses[1].startswith("Tool call success\nstdout: 42\n\nexecution time: ")
    assert responses[2].startswith("Tool call failure\nreason: \n") and "ZeroDivisionError" in responses[2]
    assert t.finish_reason == "stop"
