"""A host whose engines fail to wake their weights before the transfer (an out-of-memory on
`wake_up(["weights"])`) stops every rank at once, each with the same one line naming the node and
the cause, after the abandoning checkpoint (`rollout_side.push_weights`, the pusher's `agree`).
Without the agreement the other rank waits in the transfer's gathers until the collective timeout
(2 h on a real run; 90 s here).

Two real processes, gloo, on one node (rank 0 the rollout host, rank 1 not), through the real RL
entry (`rl_push_fault_worker.py`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rl_synthetic import tiny_rl_recipe

WORKER = Path(__file__).with_name("rl_push_fault_worker.py")


def test_a_wake_failure_on_the_host_stops_both_ranks_with_one_line_naming_it(tiny_model, tmp_path, free_port):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}*7?", "answer": str(7 * i)}) + "\n"
                            for i in range(4)))
    raw = tiny_rl_recipe(tiny_model, data, tmp_path / "run", steps=2)
    raw["sandbox"] = {"url": "http://127.0.0.1:9"}      # a client only: the fake engines call no tool
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(raw))
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RSTAR2_ENGINE"))}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port), WORLD_SIZE="2", RANK=str(rank),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(recipe), str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed_at = float((tmp_path / "wake_failed").read_text())
    lines = []
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 1, log[-3000:]
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["ended"] - failed_at < 30, log[-3000:]       # not the collective timeout (90 s)
        lines.append([line for line in log.splitlines() if line.strip()][-1])
    expected = (f"error: step 1: the weight push, before the transfer, failed on node 0 (rank 0): OutOfMemoryError: "
                f"CUDA out of memory. Tried to allocate 2.00 GiB; stopping on every rank; {tmp_path / 'run'}/"
                f"step_000001 holds step 1")
    assert lines == [expected, expected], logs[1][-3000:]
