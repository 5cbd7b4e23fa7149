"""A checkpoint write that fails part-way (`FaultPlan.checkpoint_write_step`: OSError ENOSPC) aborts the
run with one line (exit code 1), the previous checkpoint and `latest` intact, and `--resume auto`
continues from it."""
from __future__ import annotations

import pytest
from rl_synthetic import alternating, tiny_rl_recipe, write_times_seven


@pytest.mark.slow
@pytest.mark.vllm
def test_a_full_disk_at_a_save_aborts_the_run_and_resume_continues(tiny_model, tmp_path, capsys):
    from rstar2_cli.config import load_recipe_dict
    from rstar2_cli.rl.update.checkpoint import latest_checkpoint, read_trainer_state
    from rstar2_cli.rl.run.launch_entry import run_for_exit_code
    from rstar2_cli.rl.run.launch_entry import train

    data = write_times_seven(tmp_path / "train.jsonl", 5)
    out = tmp_path / "run"
    raw = tiny_rl_recipe(tiny_model, data, out, steps=3)
    code, final = run_for_exit_code(load_recipe_dict(raw), resume=False,
                                    collaborators=alternating(checkpoint_write_step=2))
    assert (code, final) == (1, None)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: step 2: checkpoint ") and "No space left on device" in line
    assert line.endswith(f"latest is still {out / 'step_000001'}")
    assert (out / "latest").read_text() == "step_000001\n"
    assert not (out / "step_000002").exists() and not (out / ".tmp_step_000002").exists()
    final = train(load_recipe_dict(raw), resume="auto", progress=False, collaborators=alternating())
    assert final == out / "final" and latest_checkpoint(out) == final
    assert read_trainer_state(final)["step"] == 3
