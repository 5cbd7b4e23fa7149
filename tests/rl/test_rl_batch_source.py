"""The batch sources (rl/run/batch_source.py, rl/run/rollout_ahead.py): both answer the step's calls with
one signature, the recipe picks one, and the synchronous source's abandon rewinds only the
batch it drew (an engine death in the rollout draws it again; one after the update does not)."""
from __future__ import annotations

import inspect

import pytest

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.run.batch_source import BatchSource, RolloutInputs, RolloutNow
from rstar2_cli.rl.run.rollout_ahead import RolloutAhead
from rstar2_cli.rl.run.sampler import DataSampler
from rstar2_cli.rl.run.trainer import batch_source_for

STEP_CALLS = ("attach", "batch", "after_update", "columns", "checkpoint_state", "abandon", "close")


@pytest.mark.parametrize("source", [RolloutNow, RolloutAhead])
def test_each_source_answers_the_steps_calls_with_the_interfaces_signature(source):
    for name in STEP_CALLS:
        want = inspect.signature(getattr(BatchSource, name))
        got = inspect.signature(getattr(source, name))
        assert list(got.parameters) == list(want.parameters), (source.__name__, name)
    assert isinstance(source.overlapped, bool) and hasattr(source(*([1] if source is RolloutAhead else [])), "partial")


def _recipe(**train):
    return load_recipe_dict({"model": {"path": "m"}, "data": {"train": "t.jsonl"}, "train": train,
                             "loss": {"tis": bool(train.get("max_staleness"))}})


def test_the_recipe_picks_the_source():
    assert type(batch_source_for(_recipe())) is RolloutNow
    ahead = batch_source_for(_recipe(max_staleness=2, partial_rollout=True))
    assert type(ahead) is RolloutAhead and ahead.max_staleness == 2 and ahead.partial and ahead.overlapped


def test_the_synchronous_source_rewinds_only_the_batch_it_drew():
    order = [DataSampler(10, 2, seed=0) for _ in range(2)]
    expected = [order[0].next_batch() for _ in range(3)]
    sampler = order[1]
    source = RolloutNow()
    source.attach(RolloutInputs(_recipe(), list(range(10)), None, sampler, None, None, None), first_index=0,
                  resumed={})
    source.batch(0)
    after_first = sampler.state_dict()
    source.batch(1)                              # step 2 draws its batch, then its rollout fails
    source.abandon(1)
    assert sampler.state_dict() == after_first   # batch 1 is drawn again on resume
    source.batch(1)
    before = sampler.state_dict()
    source.abandon(2)                            # the push failed after batch 1 trained: nothing to draw again
    assert sampler.state_dict() == before and source.checkpoint_state() == (before, {})
    assert sampler.next_batch() == expected[2]   # the data order is the unbroken one
