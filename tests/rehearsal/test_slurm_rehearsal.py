"""`rstar2_cli/recipes/slurm_rl.sbatch` as shipped, on two stand-in nodes of this CPU machine: stage 1,
stage 2 chained on it and requeued after USR1, an unpreempted stage 2 to compare with, a node's
trainer killed mid-step, then `rstar2 eval` and `rstar2 bench-tools` (tests/rehearsal/rehearsal.py,
also `make rehearsal`)."""
from __future__ import annotations

import json
import shutil

import pytest

from rehearsal import NODE_DEATH_LIMIT_S, STEPS, problems, rehearse

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis,
              pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("bwrap")),
                                 reason="needs redis-server and bubblewrap (apt-get install redis-server bubblewrap)")]


@pytest.mark.timeout(1500)
def test_the_slurm_template_runs_stage_1_then_a_requeued_stage_2_then_eval(tmp_path):
    summary = rehearse(tmp_path / "rehearsal", log=print)
    figures = {name: {k: summary[name][k] for k in ("job", "JobState", "ExitCode", "Restarts", "RunSeconds",
                                                   "tool_calls_per_step", "internal_errors")}
               for name in ("stage1", "stage2", "reference")}
    print(json.dumps({**figures, "seconds": summary["seconds"], "load_average": summary["load_average"],
                      "node_death_s": summary["node_death"]["seconds_to_end"]}, indent=1))
    assert problems(summary) == []
    # the figures the checks stand on, spelled out
    assert summary["stage1"]["steps"] == summary["stage2"]["steps"] == STEPS
    assert summary["stage2"]["Restarts"] == 1 and summary["stage2"]["ExitCode"] == 0
    assert summary["node_death"]["JobState"] == "FAILED"
    assert summary["node_death"]["seconds_to_end"] < NODE_DEATH_LIMIT_S
    assert summary["eval_bench"]["eval_metrics"]["samples_per_problem"] == 2
