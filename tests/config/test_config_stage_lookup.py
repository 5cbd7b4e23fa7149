"""`--stage N` runs the packaged recipe from any folder: a `./recipes/stageN.yaml` is used only when
given as the RECIPE path (a differing one is named in one line), and `init_from: stage1` is the
previous stage's run folder, never a folder that happens to be called `stage1`."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.config import ConfigError
from rstar2_cli.rl.run.stages import packaged_recipes, resolve_stage_recipe, shadowed_recipe_note


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _local_copy(workdir: Path, name: str, old: str, new: str) -> Path:
    text = (packaged_recipes() / f"{name}.yaml").read_text()
    assert old in text
    local = workdir / "recipes" / f"{name}.yaml"
    local.parent.mkdir(exist_ok=True)
    local.write_text(text.replace(old, new))
    return local


def test_a_local_copy_is_used_only_when_given_as_a_path(workdir):
    _local_copy(workdir, "stage2", "steps: 85 ", "steps: 7 ")
    assert resolve_stage_recipe(None, 2).train.steps == 85
    assert resolve_stage_recipe("stage2", None).train.steps == 85
    assert resolve_stage_recipe("recipes/stage2.yaml", None).train.steps == 7
    note = shadowed_recipe_note(None, 2)
    assert "\n" not in note and "recipes/stage2.yaml" in note and str(packaged_recipes() / "stage2.yaml") in note
    assert "rstar2 rl recipes/stage2.yaml" in note
    assert shadowed_recipe_note("recipes/stage2.yaml", None) is None      # the user's copy, as asked
    assert shadowed_recipe_note(None, 1) is None                          # no local copy of stage 1


def test_an_identical_local_copy_says_nothing(workdir):
    _local_copy(workdir, "stage1", "stage: 1", "stage: 1")
    assert shadowed_recipe_note(None, 1) is None


def test_init_from_is_the_previous_stages_run_folder_not_a_folder_of_that_name(workdir):
    (workdir / "stage1").mkdir()
    (workdir / "stage1" / "config.json").write_text("{}")
    assert resolve_stage_recipe(None, 2).model.path == "runs/stage1/final"
    (workdir / "stage2").mkdir()
    assert resolve_stage_recipe(None, 3).model.path == "runs/stage2/final"


def test_init_from_a_path_or_a_recipe_file(workdir):
    local = _local_copy(workdir, "stage1", "out_dir: runs/stage1", "out_dir: runs/mine")
    stage2 = _local_copy(workdir, "stage2", "init_from: stage1 ", f"init_from: {local} ")
    assert resolve_stage_recipe(str(stage2), None).model.path == "runs/mine/final"
    assert resolve_stage_recipe(None, 2, ["init_from=ckpts/s1"]).model.path == "ckpts/s1"
    with pytest.raises(ConfigError, match="init_from: 'stage9'"):
        resolve_stage_recipe(None, 2, ["init_from=stage9"])


def test_the_command_names_the_local_copy_on_stderr_and_plans_the_packaged_one(workdir):
    _local_copy(workdir, "stage1", "steps: 300 ", "steps: 3 ")
    out = CliRunner().invoke(app, ["rl", "--stage", "1", "--dry-run"], terminal_width=250, env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "packaged" in out.stderr and "rstar2 rl recipes/stage1.yaml" in out.stderr
    assert "recipes/stage1.yaml" not in out.stdout and "steps: 300" in out.stdout
