"""One rank of test_rl_logprob_gap.py: a 2-rank gloo world through `rl_dist.setup_distributed`
(env://), calling `fill_logprob_gaps` three times as a step would: both ranks hosts, each holding
gaps of the other's records; rank 0 the only host; no host logging anything.
argv: result folder; each rank writes rank<r>.json with what each call returned."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed

from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.update.logprob_gap import fill_logprob_gaps


def record(prompt_id: str, sample: int, kept: bool = True) -> dict:
    return {"prompt_id": prompt_id, "sample": sample, "advantage": 0.5 if kept else None, "logprob_gap": None}


def gap(x: float) -> dict:
    return {"mean_abs": x, "max_abs": 2 * x, "tokens": 10}


out = Path(sys.argv[1])
rank = rl_dist.setup_distributed().rank
result: dict = {}
# both ranks are hosts; each trained half of the other's kept records
records = ([record("pA", 0), record("pA", 1), record("pA", 2, kept=False)] if rank == 0
           else [record("pB", 0), record("pB", 1)])
gaps = ({("pB", 0): gap(0.1), ("pA", 1): gap(0.2)} if rank == 0
        else {("pA", 0): gap(0.3), ("pB", 1): gap(0.4), ("pC", 0): gap(0.5)})
result["two_hosts"] = fill_logprob_gaps(records, gaps, hosts=[0, 1], rank=rank)
# rank 0 the only host; rank 1 trained all of its kept records
records = [record("pA", 0), record("pA", 1)] if rank == 0 else None
gaps = {} if rank == 0 else {("pA", 0): gap(0.6), ("pA", 1): gap(0.7)}
result["one_host"] = fill_logprob_gaps(records, gaps, hosts=[0], rank=rank)
# nothing logged anywhere
result["nothing"] = fill_logprob_gaps([] if rank == 0 else None, {("pA", 0): gap(0.8)}, hosts=[0], rank=rank)
(out / f"rank{rank}.json").write_text(json.dumps(result))
rl_dist.barrier()                       # rank 0 holds the store: neither leaves while the other uses it
torch.distributed.destroy_process_group()
