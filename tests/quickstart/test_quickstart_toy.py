"""The quickstart's toy data: reproducible, held-out really held out, SFT layout = RL layout."""
from __future__ import annotations

import asyncio

import pytest

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.quickstart.settings import TOY_PROTOCOL, TOY_SYSTEM_PROMPT, QuickstartSettings, toy_rl_recipe
from rstar2_cli.quickstart.toy_sft_data import BehaviourMix, make_sft_rows
from rstar2_cli.quickstart.toy_task import make_toy_split


def test_split_is_reproducible_disjoint_and_seed_dependent():
    train, held = make_toy_split(3, 200, 50)
    again_train, again_held = make_toy_split(3, 200, 50)
    assert [p.problem for p in train] == [p.problem for p in again_train]
    assert [p.problem for p in held] == [p.problem for p in again_held]
    assert not {p.problem for p in train} & {p.problem for p in held}
    other, _ = make_toy_split(4, 200, 50)
    assert [p.problem for p in other] != [p.problem for p in train]
    for p in train[:20]:
        assert int(p.answer) == p.a * p.b + p.c
        assert p.expression in p.problem


def test_settings_presets_and_validation():
    s = QuickstartSettings.for_preset("/tmp/x", "smoke", seed=5, rl_steps=3)
    assert s.seed == 5 and s.rl_steps == 3 and s.preset == "smoke"
    with pytest.raises(ValueError, match="preset"):
        QuickstartSettings.for_preset("/tmp/x", "huge")
    with pytest.raises(ValueError, match="sft_examples"):
        QuickstartSettings.for_preset("/tmp/x", "smoke", n_train=100, sft_examples=200)


def test_toy_rl_recipe_validates_with_short_prompt_and_roc_switch():
    s = QuickstartSettings.for_preset("/tmp/x", "smoke")
    roc = load_recipe_dict(toy_rl_recipe(s, "/m", "/t.jsonl", "/o", roc=True))
    grpo = load_recipe_dict(toy_rl_recipe(s, "/m", "/t.jsonl", "/o", roc=False))
    assert roc.rollout.system_prompt == TOY_SYSTEM_PROMPT and roc.rollout.tools_in_prompt is False
    assert roc.roc.enabled and not grpo.roc.enabled
    # Same kept group size, RoC rolls out twice as many.
    assert roc.train.group_size == grpo.train.group_size
    assert roc.rollouts_per_prompt == 2 * grpo.rollouts_per_prompt


def test_toy_rl_recipe_corrects_stale_rollouts_as_the_settings_say():
    s = QuickstartSettings.for_preset("/tmp/x", "smoke")
    sync = load_recipe_dict(toy_rl_recipe(s, "/m", "/t.jsonl", "/o"))
    assert (sync.loss.old_logprobs, sync.loss.tis) == ("trainer", False)        # k = 0: the release's loss
    k1 = load_recipe_dict(toy_rl_recipe(s.model_copy(update={"max_staleness": 1}), "/m", "/t.jsonl", "/o"))
    assert (k1.loss.old_logprobs, k1.loss.tis) == ("rollout", False)            # the quickstart's default
    tis = load_recipe_dict(toy_rl_recipe(s.model_copy(update={"max_staleness": 1, "async_old_logprobs": "trainer"}),
                                         "/m", "/t.jsonl", "/o"))
    assert (tis.loss.old_logprobs, tis.loss.tis) == ("trainer", True)


class _EchoSandbox:
    """Runs the toy snippets with Python itself: enough to check row structure without workers."""

    async def run_batch(self, items, timeout=None):
        import contextlib
        import io
        import traceback
        from types import SimpleNamespace

        out = []
        for it in items:
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    exec(compile(it["code"], "<code>", "exec"), {})
                out.append(SimpleNamespace(stdout=buf.getvalue(), stderr="", reason="ok"))
            except Exception as e:  # the sandbox reports these as runtime errors
                err = "".join(traceback.format_exception_only(type(e), e))
                out.append(SimpleNamespace(stdout=buf.getvalue(), stderr=err, reason="runtime_error"))
        return out


def test_sft_rows_mix_behaviours_and_carry_real_tool_outputs():
    train, _ = make_toy_split(0, 300, 10)
    rows = asyncio.run(make_sft_rows(train, 0, _EchoSandbox(), mix=BehaviourMix(0.3, 0.3, 0.4),
                                     system_prompt=TOY_SYSTEM_PROMPT, tools_in_prompt=False))
    kinds = {r["behaviour"] for r in rows}
    assert kinds == {"guess", "buggy_repair", "correct"}
    for p, r in zip(train, rows):
        msgs = r["messages"]
        assert r["tools"] is None
        assert msgs[0] == {"role": "system", "content": TOY_SYSTEM_PROMPT}
        final = msgs[-1]["content"]
        tool_texts = [m["content"] for m in msgs if m["role"] == "tool"]
        codes = [m["tool_calls"][0]["arguments"]["code"] for m in msgs if m.get("tool_calls")]
        if r["behaviour"] == "guess":
            assert not tool_texts and f"\\boxed{{{p.answer}}}" not in final
            continue
        # every tool-using route ends on the clean call and its one-line output, then the answer
        assert codes[-1] == f"print({p.expression})" and tool_texts[-1] == p.answer
        assert f"\\boxed{{{p.answer}}}" in final
        if r["behaviour"] == "buggy_repair":
            # the model's own typo, the interpreter's real error, which echoes the line the repair copies
            assert len(codes) == 2 and codes[0] == f"print({p.expression}"
            assert "SyntaxError" in tool_texts[0] and codes[0] in tool_texts[0]
        else:
            assert len(codes) == 1


def test_sft_prompt_tokens_equal_agent_loop_prompt(tiny_model):
    """SFT conversations must start with exactly the ids the agent loop sends as the prompt."""
    from transformers import AutoTokenizer

    from rstar2_cli.protocol.template import encode_messages, problem_messages
    from rstar2_cli.sft.masks import conversation_ids_and_mask

    tok = AutoTokenizer.from_pretrained(tiny_model)
    train, _ = make_toy_split(1, 20, 5)
    rows = asyncio.run(make_sft_rows(train, 1, _EchoSandbox(), system_prompt=TOY_SYSTEM_PROMPT,
                                     tools_in_prompt=False))
    for p, r in zip(train, rows):
        # rendered as the toy's SFT and RL render it (TOY_PROTOCOL: no forced <reason>)
        ids, mask = conversation_ids_and_mask(tok, r["messages"], r["tools"], TOY_PROTOCOL["force_reason"])
        prompt = encode_messages(tok, problem_messages(p.problem, TOY_SYSTEM_PROMPT), None,
                                 add_generation_prompt=True, force_reason=TOY_PROTOCOL["force_reason"])
        assert ids[: len(prompt)] == prompt
        assert not any(mask[: len(prompt)]) and any(mask[len(prompt):])
