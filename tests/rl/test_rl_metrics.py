"""Step metrics aggregation and the JSONL writer."""
from __future__ import annotations

import pytest

from rstar2_cli.rl.logs.writer import MetricsWriter, read_metrics

from rstar2_cli.rl.measures.tally import step_metrics

from rstar2_cli.rl.measures.timer import StepTimer
from rstar2_cli.rollout.trajectory import Trajectory


def _t(reward, calls, errors, n, finish="stop"):
    return Trajectory(prompt_id="p", reward=reward, num_tool_calls=calls, num_tool_errors=errors,
                      response_ids=[1] * n, prompt_ids=[1, 2], num_turns=calls + 1, finish_reason=finish)


def test_step_metrics_aggregate_rollouts_roc_and_update(tmp_path):
    ts = [_t(1, 2, 0, 10), _t(0, 4, 3, 30, "length"), _t(1, 2, 1, 20)]
    timer = StepTimer()
    with timer("rollout"):
        pass
    m = step_metrics(3, ts, roc={"roc/groups_kept": 1.0}, update={"loss": 0.5, "grad_norm": 2.0}, timing=timer)
    assert m["rollout/accuracy"] == pytest.approx(2 / 3)
    assert m["rollout/tool_error_ratio"] == pytest.approx(4 / 8)
    assert m["rollout/tool_error_ratio_positive"] == pytest.approx(1 / 4)
    assert m["rollout/clip_ratio"] == pytest.approx(1 / 3)
    assert (m["rollout/response_length_mean"], m["rollout/response_length_max"]) == (20, 30)
    assert m["train/grad_norm"] == 2.0 and m["roc/groups_kept"] == 1.0
    assert "time/rollout" in m and "time/step" in m
    m2 = step_metrics(3, ts, update={"loss_tokens": 100.0}, timing={"time/train": 2.0})
    assert m2["throughput/train_loss_tokens_per_s"] == 50.0

    w = MetricsWriter(tmp_path, live=True)
    w.write(3, m)
    w.write(4, {"train/loss": float("nan")})
    w.close()
    MetricsWriter(tmp_path / "rank1", enabled=False).write(3, m)       # non-zero ranks write nothing
    assert not (tmp_path / "rank1").exists()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [3, 4]
    assert rows[0]["rollout/accuracy"] == pytest.approx(2 / 3) and rows[1]["train/loss"] is None
