"""`rstar2 prepare hard` rolls out with the settings the policy was trained with: the turns, tokens,
sampling, tool protocol and grader of the RL run whose `train.out_dir` holds the checkpoint (its
`resolved_recipe.yaml`), a flag given on the command line instead, and says where each came from.
A policy with no run recipe above it needs `--recipe FILE` or every sampling flag."""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.config import RESOLVED_RECIPE, dump_recipe, load_recipe, load_recipe_dict
from rstar2_cli.rl.run.stages import find_recipe

ALL_FLAGS = ["--max-turns", "3", "--max-tokens", "64", "--temperature", "0.7", "--top-p", "0.9"]


@pytest.fixture
def mined(monkeypatch):
    """The EvalSettings each `prepare hard` hands to run_eval, which records them instead of
    starting an engine (no GPU seen: one replica on the default device)."""
    from rstar2_cli.eval import runner
    from rstar2_cli.launch import eval_engines

    seen = []
    real = runner.run_eval

    def recorded(s, engine=None, tools=None, **kw):
        inspect.signature(real).bind(s, engine=engine, tools=tools, **kw)   # a call the real one takes
        seen.append(s)
        return {"engines": runner.engines_summary(s, engine), "per_problem": []}

    monkeypatch.setattr(eval_engines, "local_gpus", lambda: (0, None))
    monkeypatch.setattr(runner, "run_eval", recorded)
    return seen


@pytest.fixture
def problems(tmp_path) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"id": "a", "problem": "2+2?", "answer": "4"}) + "\n")
    return data


@pytest.fixture
def stage2_run(tmp_path, tiny_model, problems) -> Path:
    """A stage-2 run folder as `rstar2 rl --stage 2` leaves it: the resolved recipe (the packaged
    stage 2, with a few rollout and reward settings changed and the problems here) and `final`."""
    run = tmp_path / "runs" / "stage2"
    run.mkdir(parents=True)
    cfg = load_recipe(find_recipe("stage2"), [f"data.train={problems}", f"train.out_dir={run}",
                                              "rollout.temperature=0.8", "rollout.top_p=0.9",
                                              "rollout.parse_messages=strict", "rollout.tool_timeout=2.5",
                                              "reward.mode=last_boxed"])
    (run / RESOLVED_RECIPE).write_text(dump_recipe(cfg))
    (run / "final").symlink_to(tiny_model, target_is_directory=True)
    return run


def _hard(*args) -> object:
    return CliRunner().invoke(app, ["prepare", "hard", *map(str, args)])


def test_the_stage2_runs_settings_by_default(mined, stage2_run, tmp_path, problems):
    out = tmp_path / "hard.jsonl"
    res = _hard("--policy", stage2_run / "final", "--out", out)
    assert res.exit_code == 0, res.output
    (s,) = mined
    # the stage-2 recipe's 5 turns and 12K tokens, not a default of the command
    assert (s.max_turns, s.max_tokens, s.temperature, s.top_p) == (5, 12288, 0.8, 0.9)
    assert s.protocol["parse_messages"] == "strict" and s.protocol["tool_timeout"] == 2.5
    assert s.answer_mode == "last_boxed" and s.data == str(problems)
    recipe = str(stage2_run / RESOLVED_RECIPE)
    saved = json.loads(Path(f"{out}.pass_rates.json").read_text())["settings"]
    assert saved["max_turns"] == {"value": 5, "from": recipe}
    assert saved["answer_mode"] == {"value": "last_boxed", "from": recipe}
    assert saved["data"] == {"value": str(problems), "from": recipe}
    assert f"settings from {recipe}: max_turns 5, max_response_tokens 12288," in " ".join(res.output.split())


def test_an_explicit_flag_wins_over_the_recipe(mined, stage2_run, tmp_path):
    out = tmp_path / "hard.jsonl"
    res = _hard("--policy", stage2_run / "final", "--out", out, "--max-turns", "7", "--temperature", "0.5")
    assert res.exit_code == 0, res.output
    (s,) = mined
    assert (s.max_turns, s.temperature, s.max_tokens, s.top_p) == (7, 0.5, 12288, 0.9)
    saved = json.loads(Path(f"{out}.pass_rates.json").read_text())["settings"]
    assert saved["max_turns"] == {"value": 7, "from": "--max-turns"}
    assert saved["max_response_tokens"]["from"] == str(stage2_run / RESOLVED_RECIPE)
    assert "given: max_turns 7 (--max-turns), temperature 0.5 (--temperature)" in " ".join(res.output.split())


def test_a_policy_without_a_run_recipe_is_one_line(mined, tiny_model, problems, tmp_path):
    res = _hard("--policy", tiny_model, "--data", problems, "--out", tmp_path / "hard.jsonl", "--max-turns", "3")
    assert res.exit_code == 2 and not mined
    line = res.output.strip()
    assert "\n" not in line and f"--policy {tiny_model}: no {RESOLVED_RECIPE}" in line
    assert "--recipe FILE" in line and "--max-tokens, --temperature, --top-p" in line


def test_every_flag_given_needs_no_recipe(mined, tiny_model, problems, tmp_path):
    out = tmp_path / "hard.jsonl"
    res = _hard("--policy", tiny_model, "--data", problems, "--out", out, *ALL_FLAGS)
    assert res.exit_code == 0, res.output
    (s,) = mined
    assert (s.max_turns, s.max_tokens, s.temperature, s.top_p) == (3, 64, 0.7, 0.9)
    assert s.protocol == load_recipe(None).rollout.model_dump(include=set(s.protocol))   # the release's
    saved = json.loads(Path(f"{out}.pass_rates.json").read_text())["settings"]
    assert saved["top_p"]["from"] == "--top-p" and saved["answer_mode"]["from"] == "default (rstar2_cli/config.py)"


def test_recipe_option_names_the_recipe(mined, tiny_model, problems, tmp_path):
    res = _hard("--policy", tiny_model, "--data", problems, "--out", tmp_path / "hard.jsonl", "--recipe", "stage2")
    assert res.exit_code == 0, res.output
    assert mined[0].max_turns == load_recipe(find_recipe("stage2")).rollout.max_turns == 5
    res = _hard("--policy", tiny_model, "--data", problems, "--out", tmp_path / "h.jsonl", "--recipe", "nope.yaml")
    assert res.exit_code == 2 and "nope.yaml: recipe not found" in res.output


def test_the_default_output_is_what_stage_3_trains_on(mined, stage2_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _hard("--policy", stage2_run / "final")
    assert res.exit_code == 0, res.output
    stage3 = load_recipe(find_recipe("stage3")).data.train
    assert (tmp_path / stage3).is_file() and stage3 in res.output


@pytest.mark.parametrize("flag,field", [("--temperature", "temperature"), ("--top-p", "top_p")])
def test_sampling_bounds_are_the_recipes(mined, tiny_model, problems, tmp_path, flag, field):
    """One check of temperature and top-p, the config's: the command refuses what a recipe refuses,
    in the same words, naming its flag."""
    args = dict(zip(ALL_FLAGS[::2], ALL_FLAGS[1::2]), **{flag: "-1"})
    res = _hard("--policy", tiny_model, "--data", problems, "--out", tmp_path / "h.jsonl",
                *[x for kv in args.items() for x in kv])
    assert res.exit_code == 2 and not mined
    with pytest.raises(Exception) as recipe_error:
        load_recipe_dict({"rollout": {field: -1}})
    said = str(recipe_error.value).split(f"rollout.{field}: ")[1].split(" (got")[0]
    assert f"error: {flag} -1.0: {said}" in " ".join(res.output.split())
