"""Sampled instances in `run_agent_loop`: duplicate draws, seeds, session keys, and which
failures count against the model (a scripted engine and a fake tool runner, no model, no sandbox)."""
import asyncio

import pytest

from rstar2_cli.config import RolloutConfig
from rstar2_cli.models.tiny import build_tokenizer, default_corpus
from rstar2_cli.protocol import format_tool_call
from rstar2_cli.rollout.agent_loop import instance_key, occurrences, run_agent_loop, trajectory_seed
from rstar2_cli.rollout.engines import GenResult
from rstar2_cli.rollout.generation import EngineRequestError
from sandbox.core.result import RunResult

ANSWER = "<reason>It is 42.</reason>\n<answer>The answer is $\\boxed{42}$.</answer><|im_end|>"


def call(code: str) -> str:
    args = {"code": code, "input": ""}
    # the release's protocol: a turn with a call ends at end-of-turn, like any other
    return (f"<reason>Let me compute.</reason>\n<tool_call>\n{format_tool_call('python_code_with_standard_io', args)}"
            "\n</tool_call><|im_end|>")


class Engine:
    """First turn: a tool call running `codes[key]` when the key has one, else the answer."""

    def __init__(self, tok, codes=None, fail_keys=()):
        self.tok, self.codes, self.fail_keys = tok, dict(codes or {}), set(fail_keys)
        self.requests: list[tuple[str, int]] = []

    async def generate(self, req, key=None):
        self.requests.append((key, req.seed))
        if key in self.fail_keys:
            raise EngineRequestError("engine down")
        turn = sum(k == key for k, _ in self.requests) - 1
        text = call(self.codes[key]) if key in self.codes and turn == 0 else ANSWER
        ids = []
        for i in self.tok.encode(text, add_special_tokens=False):
            ids.append(i)
            if i in req.stop_token_ids:
                break
        await asyncio.sleep(0)
        return GenResult(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop", stop_token_id=ids[-1])


class Runner:
    """Code "crash" -> a sandbox internal error (e.g. a worker died), "boom" -> the snippet's own
    exception, "slow" -> the snippet's own timeout; anything else runs fine."""

    REASONS = {"crash": "internal_error", "boom": "runtime_error", "slow": "timeout"}

    async def run_batch(self, items, timeout=None):
        return [RunResult(stdout="42\n", stderr="", exit_code=0, wall_time=0.01,
                          reason=self.REASONS.get(it["code"], "ok")) for it in items]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(default_corpus(0), 512)


def rollout(tok, problems, engine, samples=2, **kw):
    cfg = RolloutConfig(max_turns=4, max_response_tokens=2048, code_runner="plain")   # Runner reads the raw code
    return asyncio.run(run_agent_loop(problems, samples, engine, Runner(), tok, cfg, seed=5, progress=False, **kw))


def test_a_problem_drawn_twice_is_two_instances_with_their_own_seeds_and_keys(tok):
    problems = [("a", "What is 6*7?", "42"), ("b", "What is 2*21?", "42"), ("a", "What is 6*7?", "42")]
    engine = Engine(tok)
    trajs = rollout(tok, problems, engine)
    assert [(t.prompt_id, t.group_index, t.sample_index) for t in trajs] == [
        ("a", 0, 0), ("a", 0, 1), ("b", 1, 0), ("b", 1, 1), ("a", 2, 0), ("a", 2, 1)]
    keys = [t.instance_key for t in trajs]
    assert len(set(keys)) == 6 and keys[4:] == [instance_key("a", 0, 1), instance_key("a", 1, 1)]
    # first draws keep the seeds they always had (runs without duplicates stay bit-identical)
    assert [t.sampling_seed for t in trajs[:4]] == [trajectory_seed(5, p, k) for p in "ab" for k in (0, 1)]
    assert keys[:4] == ["a#0", "a#1", "b#0", "b#1"]
    assert {t.sampling_seed for t in trajs[4:]}.isdisjoint({t.sampling_seed for t in trajs[:2]})


def test_a_shard_carries_global_positions_and_occurrences(tok):
    batch = [("a", "x", "1"), ("b", "y", "2"), ("a", "x", "1"), ("c", "z", "3")]
    drawn = occurrences([p[0] for p in batch])
    assert drawn == [0, 0, 1, 0]
    shards = []
    for node in (0, 1):                       # two nodes, interleaved shards
        pos = list(range(node, len(batch), 2))
        trajs = rollout(tok, [batch[i] for i in pos], Engine(tok), samples=1, group_indices=pos,
                        occurrence=[drawn[i] for i in pos])
        shards.append(trajs)
    merged = sorted((t for s in shards for t in s), key=lambda t: t.group_index)
    assert [(t.prompt_id, t.group_index) for t in merged] == [("a", 0), ("b", 1), ("a", 2), ("c", 3)]
    assert merged[0].instance_key != merged[2].instance_key and merged[0].sampling_seed != merged[2].sampling_seed


def test_only_failures_of_the_model_count_as_tool_errors(tok):
    problems = [(pid, "q", "42") for pid in ("ok", "crash", "boom", "slow", "down")]
    codes = {"ok#0": "print(42)", "crash#0": "crash", "boom#0": "boom", "slow#0": "slow"}
    trajs = rollout(tok, problems, Engine(tok, codes, fail_keys={"down#0"}), samples=1)
    by_id = {t.prompt_id: t for t in trajs}
    assert [(by_id[p].num_tool_calls, by_id[p].num_tool_errors, by_id[p].infra_error) for p in
            ("ok", "crash", "boom", "slow")] == [(1, 0, ""), (1, 0, "sandbox_internal_error"), (1, 1, ""), (1, 1, "")]
    assert by_id["crash"].num_infra_tool_calls == 1
    assert (by_id["down"].finish_reason, by_id["down"].infra_error) == ("error", "engine_error")


class ScriptEngine(Engine):
    """Each key's turns from `turns[key]` in order (text as the policy wrote it)."""

    def __init__(self, tok, turns, raise_for=None):
        super().__init__(tok)
        self.turns, self.raise_for = {k: list(v) for k, v in turns.items()}, raise_for or {}

    async def generate(self, req, key=None):
        if key in self.raise_for:
            raise self.raise_for[key]
        ids = []
        for i in self.tok.encode(self.turns[key].pop(0), add_special_tokens=False):
            ids.append(i)
            if i in req.stop_token_ids:
                break
        await asyncio.sleep(0)
        return GenResult(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop", stop_token_id=ids[-1])


def test_an_engine_failure_is_an_engine_fault_and_a_bug_in_the_loop_raises(tok):
    problems = [("ok", "q", "42"), ("down", "q", "42")]
    turns = {"ok#0": [ANSWER]}
    trajs = rollout(tok, problems, ScriptEngine(tok, turns, {"down#0": EngineRequestError("502")}), samples=1)
    assert [(t.finish_reason, t.infra_error) for t in trajs] == [("stop", ""), ("error", "engine_error")]
    with pytest.raises(TypeError, match="a bug"):
        rollout(tok, problems, ScriptEngine(tok, {"ok#0": [ANSWER]}, {"down#0": TypeError("a bug")}), samples=1)


def test_vllms_server_errors_are_engine_failures_and_its_client_errors_are_not():
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    from rstar2_cli.rollout.generation import is_engine_failure

    assert is_engine_failure(EngineGenerateError()) and is_engine_failure(EngineDeadError())
    assert not is_engine_failure(VLLMValidationError("bad request")) and not is_engine_failure(KeyError("x"))


def test_void_turns_and_turns_at_the_cap_are_counted(tok):
    from rstar2_cli.rl.measures.tally import finish_rollout, rollout_tally

    void = "<reason>Hmm, let me think again.</reason><|im_end|>"
    malformed = "<reason>Run it.</reason>\n<tool_call>\nprint(42)\n</tool_call><|im_end|>"   # no JSON
    problems = [(p, "q", "42") for p in ("void", "clean", "capped", "malformed")]
    turns = {"void#0": [void], "clean#0": [call("print(42)"), ANSWER], "capped#0": [call("print(1)")] * 4,
             "malformed#0": [malformed, ANSWER]}
    trajs = rollout(tok, problems, ScriptEngine(tok, turns), samples=1)
    assert [(t.num_void_turns, t.num_turns, t.finish_reason) for t in trajs] == [
        (1, 1, "stop"), (0, 2, "stop"), (0, 4, "max_turns"), (1, 2, "stop")]
    m = finish_rollout(rollout_tally(trajs))
    assert m["rollout/void_turn_trajectories"] == pytest.approx(2 / 4)
    assert m["rollout/void_turn_ratio"] == pytest.approx(2 / (1 + 2 + 4 + 2))
    assert m["rollout/max_turns_ratio"] == pytest.approx(1 / 4)
    assert m["rollout/tool_calls_mean"] == pytest.approx((0 + 1 + 3 + 1) / 4)
