"""The tool-loop alarm (rl/logs/loop_alarm.py) on synthetic metric sequences, the tool metrics it reads
(rl/logs/writer.py), and `train.stop_on_tool_loop` in the trainer's loop (checkpoint, then RunAborted)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rstar2_cli.rl.logs.writer import MetricsWriter

from rstar2_cli.rl.measures.tally import finish_rollout, rollout_tally
from rstar2_cli.rl.logs.loop_alarm import ToolLoopAlarm
from rstar2_cli.rollout.trajectory import Trajectory


def _run(calls_per_step, baseline_steps=5, factor=2.0, repeated=0.25):
    alarm = ToolLoopAlarm(baseline_steps, factor)
    return [alarm.observe(step, {"rollout/tool_calls_mean": c, "tools/repeated_code_ratio": repeated})
            for step, c in enumerate(calls_per_step, 1)]


def test_the_alarm_fires_once_when_calls_per_trajectory_double():
    lines = _run([2.0, 2.1, 1.9, 2.0, 2.0, 2.5, 3.9, 4.4, 5.0, 6.0])
    fired = [(i + 1, line) for i, line in enumerate(lines) if line]
    assert fired == [(8, "tool-loop alarm: step 8: 4.40 calls per trajectory, 2.2 x the first steps' 2.00; "
                         "repeated code 25.0 %")]


def test_the_alarm_stays_silent_on_flat_or_callless_runs_and_rearms():
    assert not any(_run([2.0] * 5 + [2.0, 3.9, 2.2, 1.5, 4.0]))
    assert not any(_run([0.0] * 5 + [3.0, 9.0]))             # no calls at first: no ratio to exceed
    lines = _run([1.0] * 5 + [3.0, 3.0, 1.0, 2.5])
    assert [i + 1 for i, line in enumerate(lines) if line] == [6, 9]     # one per crossing


def test_the_baseline_survives_a_checkpoint():
    alarm = ToolLoopAlarm(2, 2.0)
    for step, c in enumerate([1.0, 1.0, 3.0], 1):
        alarm.observe(step, {"rollout/tool_calls_mean": c})
    resumed = ToolLoopAlarm(2, 2.0)
    resumed.load_state_dict(alarm.state_dict())
    assert resumed.reference == 1.0 and resumed.above
    assert resumed.observe(4, {"rollout/tool_calls_mean": 3.0}) is None         # still the same crossing


def test_tool_metrics_p95_and_repeated_code():
    ts = [Trajectory(prompt_id="p", num_tool_calls=n, num_repeated_code_calls=r)
          for n, r in [(1, 0)] * 18 + [(4, 2), (10, 6)]]
    m = finish_rollout(rollout_tally(ts))
    assert m["tools/calls_per_traj_p95"] == 4.0            # nearest rank: the 19th of 20
    assert m["rollout/tool_calls_max"] == 10.0 and m["rollout/tool_calls_mean"] == pytest.approx(32 / 20)
    assert m["tools/repeated_code_ratio"] == pytest.approx(8 / 32)


def test_the_alarm_line_goes_to_the_log_and_the_live_table(tmp_path, caplog, capsys):
    MetricsWriter(tmp_path, live=True).note("tool-loop alarm: step 8: x")
    assert "tool-loop alarm: step 8: x" in caplog.text and "tool-loop alarm: step 8: x" in capsys.readouterr().out
    MetricsWriter(tmp_path / "r1", enabled=False).note("silent")
    assert "silent" not in caplog.text


@pytest.mark.parametrize("stop", [True, False])
def test_stop_on_tool_loop_checkpoints_and_raises(tmp_path, stop):
    from rstar2_cli.config import RecipeConfig
    from rstar2_cli.rl.run import trainer as trainer_mod
    from rstar2_cli.rl.run.faults import NonfiniteSteps

    calls = []
    t = object.__new__(trainer_mod.RLTrainer)
    t.cfg = RecipeConfig.model_validate({"train": {"steps": 12, "save_every": 100, "stop_on_tool_loop": stop,
                                                   "tool_loop_baseline_steps": 3}})
    t.step, t.saved_step, t.last_checkpoint = 0, 0, None
    t.info = SimpleNamespace(device=None)
    t.nonfinite = NonfiniteSteps(t.cfg.train.max_nonfinite_steps)
    t.side = SimpleNamespace(tools=None)        # the embedded pool: no outage to check
    t.writer = SimpleNamespace(plot=lambda: None)
    t.close = lambda: calls.append(("close",))
    t.tool_loop, t.tool_loop_alarm = ToolLoopAlarm(3, t.cfg.train.tool_loop_factor), None
    series = [1.0, 1.0, 1.0, 1.5, 2.5, 3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0]

    def step():     # the trainer's step, reduced to what the alarm reads
        t.step += 1
        t.tool_loop_alarm = t.tool_loop.observe(t.step, {"rollout/tool_calls_mean": series[t.step - 1]})

    def save(final=False):
        calls.append(("save", "final" if final else t.step))
        return Path(tmp_path / ("final" if final else f"step_{t.step:06d}"))

    t.save, t.train_step = save, step
    if not stop:
        assert t.train() == tmp_path / "final" and calls == [("save", "final"), ("close",)]
        return
    with pytest.raises(trainer_mod.RunAborted) as e:
        t.train()
    assert calls == [("save", 5), ("close",)]
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("tool-loop alarm: step 5: 2.50 calls per trajectory, 2.5 x")
    assert msg.endswith(f"(train.stop_on_tool_loop); {tmp_path / 'step_000005'} holds step 5")
