"""When held-out points are taken, what an eval_sets entry names, and the curves they land in."""
from __future__ import annotations

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.logs.writer import MetricsWriter, read_metrics
from rstar2_cli.rl.run.validation import eval_set_source, validation_due


def _cfg(**train):
    return load_recipe_dict({"train": {"steps": 12, **train}})


def test_points_before_training_every_n_steps_and_at_the_end():
    cfg = _cfg(eval_every=5)
    assert [s for s in range(13) if validation_due(cfg, s)] == [0, 5, 10, 12]
    assert [s for s in range(13) if validation_due(_cfg(eval_every=5, eval_before_train=False), s)] == [5, 10, 12]
    assert not any(validation_due(_cfg(), s) for s in range(13))          # eval_every 0: off


def test_eval_sets_are_benchmark_names_or_jsonl_files(tmp_path):
    assert eval_set_source("aime24") == ("aime24", None)
    f = tmp_path / "my_set.jsonl"
    assert eval_set_source(str(f)) == ("my_set", str(f))


def test_held_out_points_reach_the_jsonl_and_the_curves(tmp_path):
    writer = MetricsWriter(tmp_path, live=True)
    writer.write(0, {"step": 0.0, "eval/aime24/accuracy": 0.1, "eval/accuracy": 0.1})
    writer.write(1, {"step": 1.0, "rollout/reward_mean": 0.3, "rollout/response_length_mean": 900.0,
                     "train/skipped_empty": 0.0})
    writer.write(2, {"step": 2.0, "rollout/reward_mean": 0.4, "eval/aime24/accuracy": 0.2,
                     "eval/aime24/response_tokens_mean": 1200.0, "eval/accuracy": 0.2})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r.get("eval/aime24/accuracy") for r in rows] == [0.1, None, 0.2]
    png = writer.plot()
    assert png == tmp_path / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
