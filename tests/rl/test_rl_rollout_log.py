"""The rollout log (rl/logs/rollout_log.py): which groups a host writes, each line's schema, RoC's own
decisions and the advantages in it, and the atomic per-step, per-node file."""
from __future__ import annotations

import gzip
from collections import Counter
from types import SimpleNamespace

import pytest
from test_rl_exchange import _cfg, _piece, _select
from test_rl_step_flow import make_trainer  # noqa: F401 (fixture)

from rstar2_cli.models.tiny import build_tokenizer, default_corpus
from rstar2_cli.inspector.reader import read_step
from rstar2_cli.rl.logs.rollout_log import RolloutLog, mask_runs, pick_groups, rollout_path
from rstar2_cli.rollout.trajectory import Trajectory

KEYS = {"step", "node", "group", "prompt_id", "sample", "problem", "gold", "turns", "response_tokens", "tool_calls",
        "tool_errors", "void_turns", "finish_reason", "reward", "extracted", "grade_reason", "fault", "roc",
        "advantage", "logprob_gap"}
PROBLEMS = [SimpleNamespace(id=f"q{i}", problem=f"What is {i}*7?") for i in range(5)]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(default_corpus(0), 512)


def _host_step(tok, tmp_path, count=2, step=3, faulted=(7, 1)):
    cfg = _cfg()
    piece = _piece(range(11), cfg.rollouts_per_prompt)
    for t in piece[1]:
        t.response_ids = [i % 300 for i in t.response_ids]
    pos, sample = faulted
    victim = piece[1][pos * cfg.rollouts_per_prompt + sample]
    victim.infra_error = "sandbox_internal_error"
    log = RolloutLog(tmp_path, PROBLEMS, tok, count=count, seed=cfg.train.seed)
    mine = _select(piece, 0, cfg, step)      # as `RLTrainer.train_step` picks them, after RoC
    records = log.pick(piece[1], mine.kept, mine.advantages, step=step + 1, node=0)
    return log, SimpleNamespace(records=records, trajectories=mine.kept, advantages=mine.advantages), piece[1]


def test_a_host_logs_its_seeded_groups_and_every_faulted_one(tok, tmp_path):
    log, shard, trajs = _host_step(tok, tmp_path)
    drawn = pick_groups(trajs, 2, seed=7, step=4, node=0)
    groups = sorted({r["group"] for r in shard.records})
    assert 7 in groups and len(groups) in (2, 3) and set(groups) == {g for g, _ in drawn}
    assert len(shard.records) == len(groups) * 8           # every member of a logged group, 2G = 8
    assert pick_groups(trajs, 2, seed=7, step=4, node=0) == drawn            # seeded by (seed, step, node)
    assert {tuple(pick_groups(trajs, 2, seed=7, step=s, node=0)) for s in range(4, 12)} != {tuple(drawn)}
    for r in shard.records:
        assert set(r) == KEYS and r["step"] == 4 and r["node"] == 0
        assert r["problem"] == f"What is {r['prompt_id'][1:]}*7?"
        assert set(r["roc"]) == {"decision", "as", "rule", "p_err", "p_format"}
        assert (r["advantage"] is not None) == (r["roc"]["decision"] == "kept")
        assert sum(t["tokens"] for t in r["turns"]) == r["response_tokens"]
        if r["group"] == 7 and r["sample"] == 1:
            assert r["fault"] == "sandbox_internal_error" and r["roc"]["decision"] == "excluded"
            assert r["roc"]["p_err"] is None
    # the kept ones carry exactly the advantages the update receives
    kept = Counter((r["prompt_id"], r["sample"], round(r["advantage"], 9)) for r in shard.records
                   if r["advantage"] is not None)
    trained = Counter((t.prompt_id, t.sample_index, round(a, 9)) for t, a in zip(shard.trajectories, shard.advantages))
    assert kept and not kept - trained


def test_the_file_is_written_whole_and_named_per_node(tok, tmp_path):
    log, shard, _ = _host_step(tok, tmp_path)
    path = log.write(4, 0, 1, shard.records)
    assert path == tmp_path / "rollouts" / "step_000004.jsonl.gz" == rollout_path(tmp_path, 4, 0, 1)
    assert read_step(tmp_path, 4) == shard.records
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]          # no .tmp left behind
    assert log.write(4, 1, 2, shard.records).name == "step_000004.node1.jsonl.gz"
    assert gzip.decompress(path.read_bytes()).count(b"\n") == len(shard.records)


def test_log_rollouts_zero_writes_nothing(tok, tmp_path):
    log, shard, _ = _host_step(tok, tmp_path, count=0)
    assert shard.records == [] and log.write(4, 0, 1, shard.records) is None
    assert not (tmp_path / "rollouts").exists()


def test_turns_without_records_split_at_the_loss_mask_runs(tok, tmp_path):
    ids = tok.encode("hello world the answer is", add_special_tokens=False)
    t = Trajectory(prompt_id="q1", response_ids=ids, loss_mask=[1, 1] + [0] * (len(ids) - 3) + [1])
    assert mask_runs(t.loss_mask) == [(0, 2, 1), (2, len(ids) - 1, 0), (len(ids) - 1, len(ids), 1)]
    rec = RolloutLog(tmp_path, PROBLEMS, tok, count=1, seed=0).record(t, 1, 0, None)
    assert [x["role"] for x in rec["turns"]] == ["assistant", "tool", "assistant"]
    assert rec["turns"][1]["status"] is None and rec["turns"][0]["tool_code"] is None
    assert "".join(x["text"] for x in rec["turns"]) == tok.decode(ids)


def test_every_trainer_step_leaves_its_rollouts_file(make_trainer, tmp_path):
    """`RLTrainer.train_step` (fake engines, test_rl_step_flow.py): steps 1 and 2 each
    write rollouts/step_NNNNNN.jsonl.gz with both groups of 2 prompts x 2G = 4, as one host."""
    trainer, _, _ = make_trainer()
    metrics = [trainer.train_step(), trainer.train_step()]
    trainer.close()
    for step, m in enumerate(metrics, 1):
        recs = read_step(tmp_path / "run", step)
        assert len(recs) == 8 and {r["step"] for r in recs} == {step} and all(set(r) == KEYS for r in recs)
        assert sum(r["roc"]["decision"] == "kept" for r in recs) == m["train/trajectories"]
        assert m["time/rollout_log"] >= 0 and m["tools/loop_alarm"] == 0.0
        kept = [r for r in recs if r["advantage"] is not None]     # the gap of each trained trajectory
        assert kept and all(r["logprob_gap"] is not None for r in kept)
        assert all(r["logprob_gap"] is None for r in recs if r["advantage"] is None)
    assert sorted(p.name for p in (tmp_path / "run" / "rollouts").iterdir()) == [
        "step_000001.jsonl.gz", "step_000002.jsonl.gz"]
