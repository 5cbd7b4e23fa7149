"""One rank of the simulated two-node RL run (see test_rl_multinode_e2e.py), started by torchrun.

argv: recipe.json out_dir. Runs two RL steps through RLTrainer and writes out_dir/rank{R}.json
with what the test checks: the trajectory list this host's RoC saw each step (digest, prompt
positions and the node that rolled out each trajectory), this host's scheduler dispatch counts,
a greedy probe of this host's engine before and after training, the metrics of a held-out point
(k = 0), and (rank 0) whether the streamed engine weights equal the checkpoint's full state dict.
"""
import hashlib
import json
import sys
from pathlib import Path

import torch


def digest(trajs) -> str:
    rows = [(t.prompt_id, t.sample_index, t.response_ids, t.logprobs, t.reward) for t in trajs]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def main(recipe_path: str, out_dir: str) -> None:
    from rl_synthetic import alternating_grades

    from rstar2_cli.config import load_recipe_dict
    from rstar2_cli.rl.run.trainer import RLTrainer
    from rstar2_cli.rl.run.rollout_side import Collaborators
    from rstar2_cli.rollout.engines import GenRequest

    # A random tiny model never answers right: grade every other sample correct so the update
    # has a signal (and the engines' weights visibly move). What this host graded is what its RoC
    # selects over next (no group is staler than k here).
    seen: list[dict] = []

    def recording_grades(trajs, reward):
        alternating_grades(trajs, reward)
        seen.append({"digest": digest(trajs), "nodes": [t.rollout_node for t in trajs],
                     "order": [[t.prompt_id, t.sample_index, t.group_index] for t in trajs]})

    trainer = RLTrainer(load_recipe_dict(json.loads(Path(recipe_path).read_text())), progress=False,
                          collaborators=Collaborators(grade=recording_grades))
    probe_ids = trainer.tokenizer("Count: one two three", add_special_tokens=False)["input_ids"]

    def probe() -> dict | None:
        if not trainer.side.fleet.engines:
            return None
        res = trainer.side.fleet.engines[0].generate_batch(
            [GenRequest(prompt_ids=probe_ids, max_tokens=8, temperature=0.0)]
        )[0]
        return {"tokens": res.token_ids, "logprobs": res.logprobs}

    before = probe()
    for _ in range(2):
        trainer.train_step()
    after = probe()
    # a held-out point (the recipe's eval_sets): each host its share, rank 0 the metrics
    validation = None if trainer.cfg.train.max_staleness else trainer.validate()
    if trainer.cfg.train.max_staleness:   # asynchronous: batch 3 is in flight; every host saves its shard of it
        trainer.save()
    streamed = trainer.policy.full_state_for_engines(keep=trainer.host.is_host)
    full = dict(trainer.policy.full_state_dict())
    rank, fleet = trainer.info.rank, trainer.side.fleet
    result = {"rank": rank, "is_host": trainer.host.is_host, "node": trainer.host.node_index, "steps": seen[:2],
              "probe_before": before, "probe_after": after, "validation": validation,
              "dispatched": fleet.scheduler.stats()["dispatched"] if fleet.scheduler else None}
    if rank == 0:
        result["streamed_matches_full"] = ([k for k, _ in streamed] == list(full) and
                                           all(torch.equal(v, full[k]) for k, v in streamed))
    trainer.close()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
