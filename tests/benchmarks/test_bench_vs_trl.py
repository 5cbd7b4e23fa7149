"""benchmarks/compare/bench_vs_trl.py: TRL is given the same prompt, tool, parser and reward as rstar2, and
the smoke-sized comparison runs both trainers end to end and reports their curves."""
from __future__ import annotations

import json

import pytest

import trl_baseline as tb

SYSTEM = "You may call the python tool. Put the final answer in \\boxed{}."


def test_trl_prompt_tokens_equal_the_agent_loop_prompt(tiny_model):
    """TRL renders prompts with tools=[...]; with our template minus the tools block the ids match
    the toy recipe's agent-loop prompt (tools_in_prompt: false) exactly."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from rstar2_cli.protocol.template import encode_messages, problem_messages
    from rstar2_cli.quickstart.settings import TOY_PROTOCOL

    tok = tb.trl_tokenizer(str(tiny_model))
    msgs = problem_messages("Compute 482*37+95.", SYSTEM)
    tool = tb.subprocess_tool(tb.ToolClock(), 5.0, 512)
    trl_ids = tok.apply_chat_template(msgs, tools=[tool], add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
    assert trl_ids == encode_messages(tok, msgs, None, add_generation_prompt=True,
                                      force_reason=TOY_PROTOCOL["force_reason"])
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)


def test_trl_parser_reads_our_hermes_tool_call(tiny_model):
    from trl.chat_template_utils import parse_response

    from rstar2_cli.protocol.template import render_messages

    tok = tb.trl_tokenizer(str(tiny_model))
    call = {"name": tb.TOOL_NAME, "arguments": {"code": "print(482*37+95)", "input": ""}}
    turn = render_messages(
        tok,
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<reason>Use Python.</reason>", "tool_calls": [call]},
        ],
    )
    prompt, text = turn.split("<|im_start|>assistant\n", 1)
    prefix = tok.encode(prompt + "<|im_start|>assistant\n", add_special_tokens=False)
    parsed = parse_response(tok, tok.encode(text.rstrip("\n"), add_special_tokens=False), prefix=prefix)
    fn = parsed["tool_calls"][0]["function"]
    assert fn["name"] == tb.TOOL_NAME and fn["arguments"]["code"] == "print(482*37+95)"


def test_both_tool_flavours_return_the_agent_loops_response_text(sandbox_pool):
    clock = tb.ToolClock()
    boxed = tb.sandbox_tool(sandbox_pool, clock, 5.0, 512)
    plain = tb.subprocess_tool(clock, 5.0, 512)
    assert boxed.__name__ == plain.__name__ == tb.TOOL_NAME
    assert boxed(code="print(482*37+95)") == plain(code="print(482*37+95)") == "17929"
    assert plain(code="print(input())", input="7") == "7"
    for tool in (boxed, plain):
        out = tool(code="pritn(1)")
        assert "NameError" in out and "pritn" in out
    assert clock.calls == 5 and clock.seconds > 0


def test_outcome_reward_is_the_binary_grader_on_decoded_tokens(tiny_model):
    tok = tb.trl_tokenizer(str(tiny_model))
    reward = tb.outcome_reward(tok)
    good = tok.encode("<answer>\\boxed{17929}</answer><|im_end|>", add_special_tokens=False)
    bad = tok.encode("<answer>\\boxed{17928}</answer><|im_end|>", add_special_tokens=False)
    assert reward(prompts=[None, None], completions=[None, None], completion_ids=[good, bad],
                  answer=["17929", "17929"]) == [1.0, 0.0]


def test_grpo_config_matches_the_recipe_where_trl_allows(tmp_path):
    spec = tb.TrlRunSpec(steps=3, prompts_per_step=8, group_size=4, lr=3e-4, max_response_tokens=200, max_turns=4,
                         temperature=1.0, seed=0, use_vllm=False)
    cfg = tb.grpo_config(spec, tmp_path)
    assert (cfg.loss_type, cfg.beta, cfg.epsilon, cfg.epsilon_high) == ("dapo", 0.0, 0.2, 0.28)
    assert cfg.generation_batch_size == 32 and cfg.num_generations == 4 and cfg.num_iterations == 1
    assert cfg.max_completion_length == 200 and cfg.max_tool_calling_iterations == 3
    assert cfg.learning_rate == 3e-4 and cfg.lr_scheduler_type == "constant"
    assert cfg.weight_decay == 0.0 and tb.grpo_config(tb.TrlRunSpec(**{**spec.__dict__, "weight_decay": 0.01}),
                                                      tmp_path).weight_decay == 0.01
    with pytest.raises(ValueError, match="micro-batches"):
        tb.grpo_config(tb.TrlRunSpec(**{**spec.__dict__, "prompts_per_step": 3, "group_size": 2}), tmp_path)


@pytest.mark.slow
@pytest.mark.vllm
def test_smoke_comparison_runs_both_trainers_and_reports(tmp_path):
    import bench_vs_trl

    out = tmp_path / "bench"
    result = bench_vs_trl.main(["--smoke", "--out", str(out), "--json", str(tmp_path / "r.json")])
    assert set(result["rows"]) == set(bench_vs_trl.DEFAULT_ROWS)
    assert "NCCL" in result["rows"]["trl_async"]["unavailable"]          # CPU: one line why, no curve
    for name, row in result["rows"].items():
        if name == "trl_async":
            continue
        assert row["weight_decay"] == bench_vs_trl.WEIGHT_DECAY, name      # the same on every row
        assert len(row["steps"]) == 2, name
        assert [p["step"] for p in row["heldout"]] == [0, 1, 2], name
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in row["heldout"])
        secs = [p["seconds"] for p in row["heldout"]]
        assert secs == sorted(secs)                                         # a clock that runs forward
        st = row["steps"][-1]
        assert {"step_seconds", "generation", "update"} <= set(st)          # the time split the report plots
    assert "colocate" in result["rows"]["trl_sandbox"]["generation_backend"]   # TRL's recommended set-up
    assert result["rows"]["rstar2_k1"]["max_staleness"] == 1
    cmp = result["comparison"]
    assert "step_time_ratio" in cmp["trl_sandbox"] and "accuracy_at_rstar2_budget" in cmp["rstar2_k1"]
    assert "trainer_idle_frac" in cmp["rstar2_k1"]["mean_step"]
    assert json.loads((tmp_path / "r.json").read_text())["config"]["rl_steps"] == 2
    assert (out / "accuracy_vs_minutes.png").stat().st_size > 5_000


def test_accuracy_at_a_budget_is_the_last_point_reached_or_the_start():
    import bench_vs_trl

    row = {"heldout": [{"seconds": 31.0, "accuracy": 0.1}, {"seconds": 60.0, "accuracy": 0.5},
                       {"seconds": 90.0, "accuracy": 0.7}]}
    # the start point's clock includes set-up: a budget that ends before it still means "the start"
    assert [bench_vs_trl.accuracy_at(row, s) for s in (28.0, 61.0, 100.0)] == [0.1, 0.5, 0.7]


def test_a_row_that_cannot_run_says_why_and_the_table_still_prints(capsys):
    import bench_vs_trl

    point = {"step": 0, "seconds": 1.0, "accuracy": 0.4}
    base = {"generation_backend": "vLLM (x)", "setup_seconds": 1.0, "heldout": [point, {**point, "step": 2,
            "seconds": 60.0, "accuracy": 0.95}], "steps": [{"step_seconds": 30.0, "generation": 10.0, "tools": 0.1,
                                                            "reward": 0.1, "update": 19.0}] * 2}
    rows = {"rstar2": base, "trl_async": {"unavailable": bench_vs_trl.trl_async_unavailable(cuda=False)},
            "trl_sandbox": {"failed": "exit 1: AttributeError: boom"}}
    result = {"config": {"seed": 0, "prompts_per_step": 8, "group_size": 4}, "options": {"weight_decay": 0.01},
              "rows": rows, "comparison": bench_vs_trl.compare(rows)}
    bench_vs_trl.print_table(result)
    out = capsys.readouterr().out
    assert "could not run" in out and "NCCL" in out and "boom" in out and "weight decay 0.01" in out
