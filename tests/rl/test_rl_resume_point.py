"""Which checkpoint `--resume` takes, and why, in one line; a missing or damaged one is an error
that names the file and the way on, never a silent fall back to an older checkpoint."""
from __future__ import annotations

import pytest
from rl_synthetic import write_checkpoint

from rstar2_cli.rl.run.resume import ResumeError, resume_point


def cut(path, keep: int = 100):
    path.write_bytes(path.read_bytes()[:keep])


@pytest.fixture
def run(tmp_path):
    for step in (2, 4):
        write_checkpoint(tmp_path / f"step_{step:06d}", step)
    (tmp_path / "latest").write_text("step_000004\n")
    return tmp_path


def test_latest_names_the_checkpoint_and_the_reason_says_so(run):
    assert resume_point(run, "latest") == (run / "step_000004", f"the checkpoint {run / 'latest'} names")


def test_without_latest_the_newest_complete_step_folder_and_the_reason_says_so(run):
    (run / "latest").unlink()
    ckpt, why = resume_point(run, "auto")
    assert ckpt == run / "step_000004" and why == f"no {run / 'latest'} file: the newest complete step folder"


def test_latest_naming_a_folder_that_is_gone_is_an_error_with_the_way_on(run):
    (run / "latest").write_text("step_000006\n")
    with pytest.raises(ResumeError, match=r"names step_000006, which is gone; remove .*latest to resume from "
                                          r".*step_000004, the newest complete step folder"):
        resume_point(run, "auto")


@pytest.mark.parametrize("victim", ["model-00001-of-00001.safetensors", "state/__0_0.distcp"])
def test_a_file_cut_short_is_named_and_the_older_checkpoint_is_only_offered(run, victim):
    cut(run / "step_000004" / victim)
    with pytest.raises(ResumeError) as e:
        resume_point(run, "latest")
    line = str(e.value)
    assert f"checkpoint {run / 'step_000004'} is damaged ({run / 'step_000004' / victim}: cut off at 100" in line
    assert line.endswith(f"the run does not fall back by itself: remove {run / 'step_000004'} and "
                         f"{run / 'latest'} to resume from {run / 'step_000002'}")
    assert "\n" not in line


def test_no_checkpoint(tmp_path):
    with pytest.raises(ResumeError, match="--resume: no checkpoint in .*; --resume auto starts fresh"):
        resume_point(tmp_path, "latest")
    assert resume_point(tmp_path, "auto") == (None, f"--resume auto: no checkpoint in {tmp_path}, starting fresh")
    assert resume_point(tmp_path, None) == (None, "")
