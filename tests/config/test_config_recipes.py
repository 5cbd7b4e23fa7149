"""Recipes: the paper's constants load from YAML, overrides apply, bad input fails in one line."""
from __future__ import annotations

import pytest

from rstar2_cli.config import ConfigError, load_recipe, load_recipe_dict
from rstar2_cli.rl.run.stages import resolve_stage_recipe


@pytest.mark.parametrize("stage,max_len,turns,steps", [(1, 8192, 5, 300), (2, 12288, 5, 85), (3, 12288, 15, 125)])
def test_paper_stage_recipes(stage, max_len, turns, steps):
    cfg = resolve_stage_recipe(None, stage, [])
    assert cfg.stage == stage
    assert cfg.rollout.max_response_tokens == max_len and cfg.rollout.max_turns == turns
    assert cfg.train.prompts_per_step == 512 and cfg.train.group_size == 16 and cfg.rollouts_per_prompt == 32
    assert cfg.rollout.temperature == 1.0 and cfg.optim.lr == 1e-6 and cfg.optim.warmup_steps == 20
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.2, 0.28) and cfg.train.steps == steps
    # release: AdamW weight decay 0.01, outcome-only reward, AIME24 validated before and every 5 steps
    assert cfg.optim.weight_decay == 0.01 and cfg.reward.mode == "outcome" and cfg.roc.reject_equal_reward
    assert (cfg.train.eval_every, cfg.train.eval_sets, cfg.train.eval_before_train) == (5, ["aime24"], True)


def test_stage_lengths_add_up_to_the_papers_510_steps():
    steps = [resolve_stage_recipe(None, s, []).train.steps for s in (1, 2, 3)]
    assert sum(steps) == 510 and steps[0] == 300       # stage 2 starts after ~300 steps


def test_every_number_in_the_paper_recipes_names_its_source():
    import re
    from pathlib import Path

    from rstar2_cli.rl.run.stages import packaged_recipes

    for name in ("stage1", "stage2", "stage3", "sft"):
        for n, line in enumerate((packaged_recipes() / f"{name}.yaml").read_text().splitlines(), 1):
            body = line.split("#", 1)[0]
            if re.search(r":\s*[-+]?\d", body) and not body.strip().startswith("stage:"):   # a number
                assert "#" in line, f"{name}.yaml:{n}: {line.strip()!r} has no source comment"


def test_stages_chain_checkpoints_and_stage3_resets_optimizer():
    s1, s2, s3 = (resolve_stage_recipe(None, s, []) for s in (1, 2, 3))
    assert s2.model.path == f"{s1.train.out_dir}/final"
    assert s3.model.path == f"{s2.train.out_dir}/final"
    assert s3.data.train.endswith("math_hard.jsonl") and s3.optim.reset and not s2.optim.reset
    # an explicit --set model.path wins over the stage link
    assert resolve_stage_recipe(None, 2, ["model.path=/ckpt/x"]).model.path == "/ckpt/x"
    # stage 2 carries stage 1's AdamW state and LR position, stage 3 starts them afresh; the plan says so
    from rstar2_cli.rl.run.stages import continues_optimizer, start_text

    assert [continues_optimizer(s) for s in (s1, s2, s3)] == [False, True, False]
    assert "AdamW moments and LR-schedule position" in start_text(s2)
    assert "a fresh AdamW and 20-step LR warm-up (optim.reset)" in start_text(s3)


def test_overrides_parse_yaml_values():
    cfg = load_recipe(None, ["optim.lr=2e-6", "roc.enabled=false", "train.group_size=4", "sandbox.url=null"])
    assert cfg.optim.lr == 2e-6 and cfg.roc.enabled is False and cfg.rollouts_per_prompt == 4
    assert cfg.sandbox.url is None


@pytest.mark.parametrize("override,fragment", [
    ("loss.eps_hihg=0.3", "loss.eps_hihg: unknown field"),
    ("train.steps=abc", "train.steps"),
    ("loss.eps_high=0.1", "eps_high (0.1) must be >= loss.eps_low"),
    ("roc.mode=fancy", "roc.mode"),
    ("rollout.top_p=0", "rollout.top_p"),
    ("lr=1", "lr: unknown field"),
    ("optim", "expected key=value"),
    ("train.keep_checkpoints=-1", "train.keep_checkpoints"),
    ("train.keep_checkpoints=two", "train.keep_checkpoints"),
])
def test_bad_overrides_fail_with_one_line(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_recipe(None, [override])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_bad_recipe_files_name_the_file(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("train:\n  steps: -3\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: train\.steps"):
        load_recipe(p)
    p.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_recipe(p)
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="recipe not found"):
        resolve_stage_recipe("nope", None, [])


def test_stage3_without_reset_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match="optim.reset"):
        resolve_stage_recipe(None, 3, ["optim.reset=false"])


def test_recipe_dict_defaults_are_the_paper():
    cfg = load_recipe_dict({})
    assert cfg.roc.mode == "paper" and cfg.roc.oversample == 2 and cfg.loss.tis is False
    assert cfg.optim.grad_clip == 1.0 and cfg.optim.weight_decay == 0.01 and cfg.reward.mode == "outcome"
    assert cfg.train.eval_every == 0          # validation only where a recipe asks for it


@pytest.mark.parametrize("override,fragment", [
    ("reward.mode=paper", "reward.mode"),                 # not a mode: outcome, strict_answer_tag or last_boxed
    ("train.eval_sets=[]", "train.eval_sets"),
    ("train.eval_samples=0", "train.eval_samples"),
])
def test_bad_reward_and_validation_fields_fail_with_one_line(override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_recipe(None, [override])


def test_micro_batch_tokens_is_a_number_or_auto_and_auto_is_a_number_on_cpu():
    """The GPU stage recipes leave train.micro_batch_tokens to `rstar2 rl` (auto); on CPU it is
    CPU_MICRO_BATCH_TOKENS at load, so the trainer never sees "auto"."""
    from rstar2_cli.config import CPU_MICRO_BATCH_TOKENS, MIN_MICRO_BATCH_TOKENS, check_placement

    for stage in (1, 2, 3):
        assert resolve_stage_recipe(None, stage, []).train.micro_batch_tokens == "auto"
        assert resolve_stage_recipe(None, stage, [], on_gpu=True).train.micro_batch_tokens == "auto"
        assert resolve_stage_recipe(None, stage, [], on_gpu=False).train.micro_batch_tokens == CPU_MICRO_BATCH_TOKENS
    assert load_recipe(None, ["train.micro_batch_tokens=8192"], on_gpu=True).train.micro_batch_tokens == 8192
    for bad in (MIN_MICRO_BATCH_TOKENS - 1, "lots", 0):
        with pytest.raises(ConfigError) as e:
            load_recipe(None, [f"train.micro_batch_tokens={bad}"])
        assert str(e.value) == (f"<defaults>: train.micro_batch_tokens: input should be greater than or equal to "
                                f"{MIN_MICRO_BATCH_TOKENS}, or 'auto' (got {bad!r})") or \
            str(e.value) == f"<defaults>: train.micro_batch_tokens: input should be a valid integer, unable to " \
                            f"parse string as an integer, or 'auto' (got {bad!r})", str(e.value)
    # the trainer's own check: on CPU auto becomes the fixed value; on GPU only `rstar2 rl` sizes it
    cfg = resolve_stage_recipe(None, 2, [])
    assert check_placement(cfg, on_gpu=False).train.micro_batch_tokens == CPU_MICRO_BATCH_TOKENS
    with pytest.raises(ConfigError, match=r"^<recipe>: train.micro_batch_tokens=auto on GPU is sized by `rstar2 rl` "
                                          r"from the memory plan: launch through it, or give a number$"):
        check_placement(cfg, on_gpu=True)
