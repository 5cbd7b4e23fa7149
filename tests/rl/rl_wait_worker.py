"""One rank of test_rl_host_wait.py: a 2-rank gloo world through `rl_dist.setup_distributed`
(env://, rank 0 holds the store), with a collective timeout of 2 s and heartbeats every 0.1 s.

argv: scenario, result folder. `slow`: the host (rank 0) rolls out for 5 s, past the timeout, then
broadcasts; then both ranks gather to rank 0, rank 1 after 3 s (a host validating its share);
`dead`: the host (rank 1) dies mid-rollout; `store_gone`: the host is rank 0, whose
process holds the store, and it dies. Each rank writes what it got or raised, and when."""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

from rstar2_cli.rl.ranks import dist as rl_dist

scenario, out = sys.argv[1], Path(sys.argv[2])
rl_dist.COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=2)
rl_dist.HEARTBEAT_S, rl_dist.SILENT_S = 0.1, 3.0
rank = rl_dist.setup_distributed().rank
host = 1 if scenario == "dead" else 0
started = time.monotonic()
result: dict = {}
try:
    if rank == host and scenario == "slow":
        time.sleep(5.0)
        result["got"] = rl_dist.broadcast_from_each("rolled out", [host])
    elif rank == host:
        time.sleep(0.5)
        os._exit(3)                     # dies mid-rollout: no broadcast, no more heartbeats
    else:
        result["got"] = rl_dist.broadcast_from_each(None, [host])
    if scenario == "slow":
        time.sleep(3.0 * rank)
        result["gathered"] = rl_dist.gather_from(f"share of {rank}", [0, 1])
except Exception as e:                  # noqa: BLE001 - what the rank raised is the result
    result.update(error=str(e), type=type(e).__name__)
result["seconds"] = time.monotonic() - started
(out / f"{scenario}_rank{rank}.json").write_text(json.dumps(result))
