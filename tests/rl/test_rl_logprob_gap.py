"""Each logged trajectory's engine/trainer log-prob gap (rl/update/logprob_gap.py): the update returns it
per trajectory from the tensors it already has, and `fill_logprob_gaps` joins it across ranks into
the rollout hosts' records (real collectives: two gloo processes, `rl_gap_worker.py`)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rl_synthetic import make_trajectories
from test_rl_exchange import _cfg, _piece

from rstar2_cli.config import LossConfig, ModelConfig, OptimConfig
from rstar2_cli.models.tiny import build_tokenizer, default_corpus
from rstar2_cli.rl.update.logprob_gap import add_gap, fill_logprob_gaps, gap_label
from rstar2_cli.rl.update.loss import group_advantages
from rstar2_cli.rl.update.policy import PolicyTrainer, loss_positions
from rstar2_cli.rl.ranks.exchange import exchange
from rstar2_cli.rl.selection.host_selection import GradedBatch, select_on_host
from rstar2_cli.rl.logs.rollout_log import RolloutLog, StepLog, rollout_path

WORKER = Path(__file__).with_name("rl_gap_worker.py")


def _policy(model_dir, **kw) -> PolicyTrainer:
    return PolicyTrainer(ModelConfig(path=str(model_dir), gradient_checkpointing=False), OptimConfig(lr=1e-3),
                         LossConfig(), micro_batch_tokens=kw.pop("micro_batch_tokens", 4096), **kw)


def _expected(policy: PolicyTrainer, batch) -> dict:
    """Each trajectory's gap computed apart: the policy's log-probs before the update against the engine's."""
    out = {}
    for t, lp in zip(batch, policy.compute_logprobs(batch)):
        if len(t.logprobs) == len(t.response_ids):
            d = (lp - torch.tensor(t.logprobs)[loss_positions(t)]).abs()
            out[gap_label(t)] = (float(d.mean()), float(d.max()), d.numel())
    return out


@pytest.mark.parametrize("micro_batch_tokens", [4096, 64])      # one packed row; a row per trajectory or two
def test_the_update_gives_each_trajectory_its_gap_and_the_metric_is_their_token_mean(tiny_model_dir,
                                                                                     micro_batch_tokens):
    batch = make_trajectories(6, seed=3)
    batch[2].logprobs = []                 # no engine log-probs: no gap, and its row-mates still get theirs
    adv = group_advantages([t.reward + 0.3 * (i % 2) for i, t in enumerate(batch)])
    policy = _policy(tiny_model_dir, micro_batch_tokens=micro_batch_tokens)
    expected = _expected(policy, batch)
    out = policy.update(batch, adv)
    gaps = out.gaps
    assert set(gaps) == set(expected) == {gap_label(t) for i, t in enumerate(batch) if i != 2}
    for label, (mean, top, tokens) in expected.items():
        assert gaps[label]["tokens"] == tokens
        assert gaps[label]["mean_abs"] == pytest.approx(mean, abs=1e-5)
        assert gaps[label]["max_abs"] == pytest.approx(top, abs=1e-5)
    weighted = sum(g["mean_abs"] * g["tokens"] for g in gaps.values()) / sum(g["tokens"] for g in gaps.values())
    assert out["logprob_abs_diff_vllm"] == pytest.approx(weighted, rel=1e-6)


def test_the_proximal_pass_is_the_reference_with_several_mini_batches(tiny_model_dir):
    batch = make_trajectories(8, seed=6)
    adv = group_advantages([t.reward + 0.2 * i for i, t in enumerate(batch)])
    policy = _policy(tiny_model_dir, ppo_mini_batches=2)
    expected = _expected(policy, batch)            # the weights before the first of the two optimizer steps
    gaps = policy.update(batch, adv).gaps
    assert {k: round(v["mean_abs"], 5) for k, v in gaps.items()} == {k: round(v[0], 5) for k, v in expected.items()}


def test_two_trained_trajectories_with_one_label_have_no_gap():
    t = make_trajectories(1)[0]
    gaps: dict = {}
    add_gap(gaps, t, 3.0, 6.0, 1.0)
    assert gaps[gap_label(t)] == {"mean_abs": 0.5, "max_abs": 1.0, "tokens": 6}
    add_gap(gaps, t, 1.0, 2.0, 1.0)         # the same problem drawn twice in one batch
    assert gaps[gap_label(t)] is None
    add_gap(gaps, make_trajectories(2)[1], 0.0, 0.0, 0.0)      # no loss token: nothing recorded
    assert len(gaps) == 1


def _record(prompt_id, sample, kept=True):
    return {"prompt_id": prompt_id, "sample": sample, "advantage": 0.1 if kept else None, "logprob_gap": None}


def test_without_a_process_group_it_is_a_plain_join():
    g = {"mean_abs": 0.1, "max_abs": 0.4, "tokens": 9}
    records = [_record("p1", 0), _record("p1", 1), _record("p1", 2, kept=False), _record("p2", 0),
               _record("p3", 0), _record("p3", 0)]
    gaps = {("p1", 0): g, ("p1", 2): g, ("p2", 0): None, ("p3", 0): g, ("p9", 9): g}
    out = fill_logprob_gaps(records, gaps, hosts=[0], rank=0)
    assert out is records
    assert [r["logprob_gap"] for r in records] == [
        g,        # trained here
        None,     # kept but not trained with the engine's log-probs
        None,     # not kept: never joined, even where a trained trajectory shares its label
        None,     # two trained trajectories with its label
        None, None]    # two kept records with one label
    assert fill_logprob_gaps(None, gaps, hosts=[0], rank=0) is None


def test_every_kept_record_of_a_real_step_gets_the_gap_of_the_trajectory_trained(tiny_model_dir, tmp_path):
    """A step as the trainer runs it on one rank: the host's selection with its rollout-log pick,
    the exchange, the update, then the step log's join and write; the records' gaps are those of
    the very trajectories."""
    cfg = _cfg()
    piece = _piece(range(6), cfg.rollouts_per_prompt, max_len=40)
    for t in piece[1]:
        t.prompt_ids = [i % 384 for i in t.prompt_ids]
        t.response_ids = [i % 384 for i in t.response_ids]
    log = RolloutLog(tmp_path, [], build_tokenizer(default_corpus(0), 512), count=6, seed=cfg.train.seed)
    step_log = StepLog(log, count=6, hosts=[0], rank=0, node=0)
    _, trajs, seconds = piece
    mine = select_on_host(GradedBatch(trajs, len(trajs), seconds), cfg, index=0, node=0, pick=step_log.picker(1))
    shard = exchange(mine, [0], 0, 1, cfg.train.ppo_mini_batches)
    policy = _policy(tiny_model_dir, ppo_mini_batches=cfg.train.ppo_mini_batches)
    expected = _expected(policy, shard.trajectories)
    update = policy.update(shard.trajectories, shard.advantages, shard.mini_batches)
    step_log.write(1, update.gaps, trained=True)
    with gzip.open(rollout_path(tmp_path, 1, 0, 1), "rt") as f:
        records = [json.loads(line) for line in f]
    kept = [r for r in records if r["advantage"] is not None]
    labels = [gap_label(t) for t in shard.trajectories]
    unique = {k for k in labels if labels.count(k) == 1}
    assert len(kept) == len(shard.trajectories) and len(unique) < len(labels)      # q0 drawn at positions 0 and 5
    for r in records:
        label = (r["prompt_id"], r["sample"])
        if r["advantage"] is None or label not in unique or label not in expected:
            assert r["logprob_gap"] is None
        else:
            assert r["logprob_gap"]["mean_abs"] == pytest.approx(expected[label][0], abs=1e-5)
    assert sum(r["logprob_gap"] is not None for r in records) >= 8


@pytest.mark.slow
def test_the_join_across_two_real_ranks(tmp_path, free_port):
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port), WORLD_SIZE="2", RANK=str(rank),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    def means(records):
        return [None if r["logprob_gap"] is None else r["logprob_gap"]["mean_abs"] for r in records]

    assert means(r0["two_hosts"]) == [0.3, 0.2, None]      # (pA, 0) trained on rank 1, (pA, 1) here, not kept
    assert means(r1["two_hosts"]) == [0.1, 0.4]            # (pB, 0) trained on rank 0; (pC, 0) asked by nobody
    assert means(r0["one_host"]) == [0.6, 0.7] and r1["one_host"] is None
    assert r0["nothing"] == [] and r1["nothing"] is None
