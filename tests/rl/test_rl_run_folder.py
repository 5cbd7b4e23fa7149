"""A run folder belongs to one run: `rstar2 rl` without `--resume` into a `train.out_dir` that holds
a run (a `step_<n>` checkpoint, `latest`, or metrics.jsonl rows) is refused in one line before
anything starts or is written; `--resume` / `--resume auto` continue it; an empty or new folder
starts. The launch itself is stubbed: these tests stop where the run would start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.config import RESOLVED_RECIPE
from rl_synthetic import write_checkpoint

from rstar2_cli.rl.run import launch_entry
from rstar2_cli.rl.run.run_folder import previous_run, refusal


def _used(folder: Path, *, latest: bool = True, steps: tuple[int, ...] = (2, 4), rows: int = 4) -> Path:
    """What a run leaves: step folders, `latest` naming the newest, one metrics row per step."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in steps:
        write_checkpoint(folder / f"step_{n:06d}", n)
    if latest and steps:
        (folder / "latest").write_text(f"step_{max(steps):06d}")
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "rollout/reward_mean": 0.5}) + "\n"
                                                  for i in range(rows)))
    return folder


@pytest.fixture
def launched(monkeypatch):
    """The `resume` each launch got; a launch returns 0 without starting anything."""
    calls: list = []

    def fake_launch(plan, cfg, *, resume, console, node_rank=None):
        calls.append(resume)
        return 0

    monkeypatch.setattr(launch_entry, "launch", fake_launch)
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)      # the held-out set ships with rstar2
    return calls


@pytest.fixture
def rl(tmp_path, stub_checkpoint):
    """`rstar2 rl --stage 1` on the stub checkpoint and one problem, into `out_dir`."""
    data = tmp_path / "problems.jsonl"
    data.write_text(json.dumps({"id": "1", "problem": "What is 1+1?", "answer": "2"}) + "\n")

    def invoke(out_dir: Path, *extra: str):
        return CliRunner().invoke(app, ["rl", "--stage", "1", "--set", f"model.path={stub_checkpoint}", "--set",
                                        f"data.train={data}", "--set", f"train.out_dir={out_dir}", *extra])
    return invoke


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_a_fresh_start_into_a_folder_holding_a_run_is_one_line_naming_the_step_and_the_ways_on(tmp_path, launched, rl):
    used = _used(tmp_path / "run")
    before = _snapshot(used)
    out = rl(used)
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.output
    line = lines[0]
    assert f"train.out_dir {used}: already holds a run, at step 4" in line
    assert "latest -> step_000004" in line and "metrics.jsonl through step 4" in line
    assert "--resume (its latest checkpoint)" in line and "--resume auto" in line
    assert "another train.out_dir (--set train.out_dir=DIR)" in line
    assert launched == [] and not (used / RESOLVED_RECIPE).exists()     # nothing started, nothing written
    assert _snapshot(used) == before


@pytest.mark.parametrize("kind", ["latest only", "step folder only", "metrics only"])
def test_each_trace_of_a_run_is_enough_to_refuse(tmp_path, launched, rl, kind):
    folder = tmp_path / "run"
    if kind == "latest only":
        folder.mkdir()
        (folder / "latest").write_text("step_000007")
    elif kind == "step folder only":
        _used(folder, latest=False, steps=(7,), rows=0)
        (folder / "metrics.jsonl").unlink()
    else:
        _used(folder, latest=False, steps=(), rows=7)
    out = rl(folder)
    assert out.exit_code == 2 and "already holds a run, at step 7" in out.output, out.output
    assert launched == []


@pytest.mark.parametrize("resume", ["auto", "latest"])
def test_resume_continues_a_used_folder(tmp_path, launched, rl, resume):
    used = _used(tmp_path / "run")
    out = rl(used, "--resume", resume)
    assert out.exit_code == 0, out.output
    assert launched == [resume] and (used / RESOLVED_RECIPE).is_file()


def test_a_new_an_empty_and_a_recipe_only_folder_start(tmp_path, launched, rl):
    empty = tmp_path / "empty"
    empty.mkdir()
    recipe_only = tmp_path / "recipe_only"
    recipe_only.mkdir()
    (recipe_only / RESOLVED_RECIPE).write_text("name: x\n")        # a launch that failed before step 1
    (recipe_only / "metrics.jsonl").write_text("")
    for folder in (tmp_path / "new", empty, recipe_only):
        out = rl(folder)
        assert out.exit_code == 0, out.output
    assert launched == [None, None, None]


def test_previous_run_reads_the_highest_step_any_trace_names(tmp_path):
    assert previous_run(tmp_path / "missing") is None and previous_run(tmp_path) is None
    run = _used(tmp_path / "run", steps=(2, 4), rows=5)                # rows past the last checkpoint
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 6, "rollout')  # cut line
    found = previous_run(run)
    assert found is not None and found.step == 5
    assert found.traces == ("latest -> step_000004", "step_000002 .. step_000004", "metrics.jsonl through step 5")
    assert refusal(run, "auto") is None and refusal(run, "latest") is None
    assert "\n" not in refusal(run, None)
