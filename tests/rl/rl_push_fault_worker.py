"""One rank of test_rl_push_wake_failure.py: the real RL entry (`launch_entry.run_for_exit_code`:
setup_distributed on gloo, the trainer, its rollout side, the weight pusher) on two ranks of one
node, over colocated engines (`Collaborators(engines_sleep=...)`) that answer at once
(`fake_replica.py`) and whose `wake_up(["weights"])` fails on the host as an out-of-memory would.

argv: recipe.json, result folder. The host writes when its wake failed; each rank writes its exit
code and when it returned. The collective timeout is 90 s, so a rank left in a gather shows."""
from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

import torch
from fake_replica import FakeReplica
from rl_synthetic import alternating_grades
from transformers import AutoTokenizer

from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.ranks import dist as rl_dist
from rstar2_cli.rl.run.launch_entry import run_for_exit_code
from rstar2_cli.rl.run.rollout_side import Collaborators

recipe, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
rl_dist.COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=90)


class WakeOutOfMemory(FakeReplica):
    async def wake_up(self, tags=None):
        if tags == ["weights"]:
            (out / "wake_failed").write_text(str(time.time()))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        await super().wake_up(tags)


FakeReplica.log = []
FakeReplica.tokenizer = AutoTokenizer.from_pretrained(recipe["model"]["path"])
collaborators = Collaborators(make_engine=WakeOutOfMemory.from_config, grade=alternating_grades,
                      engines_sleep=lambda cfg, device: True)
code, _ = run_for_exit_code(load_recipe_dict(recipe), resume=False, collaborators=collaborators)
rank = rl_dist.process_info().rank
(out / f"rank{rank}.json").write_text(json.dumps({"code": code, "ended": time.time()}))
sys.exit(code)
