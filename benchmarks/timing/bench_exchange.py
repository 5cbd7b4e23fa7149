"""Bytes each rank receives per step when the rolled-out trajectories reach the trainer ranks:
the old exchange against `rstar2_cli/rl/ranks/exchange.py`, in one invocation, on synthetic trajectories
(no model, no process group: the sizes are those of the pickles the collectives send).

  old  every rollout host broadcast its piece (a pickled list of Trajectory objects) to every
       rank (`broadcast_object_list`, one per host), and every rank ran RoC on the whole batch:
       a rank received every host's piece.
  new  every host runs RoC over its own groups and broadcasts a summary (tallies, kept lengths);
       then scatters to each rank its kept trajectories as arrays (`scatter_object_list`, which
       pads every rank's part to the largest of that host's parts): a rank receives every
       host's summary and one padded part per host.

Default shapes are stage 2's (recipes/stage2.yaml: 512 prompts, G = 16 with RoC's oversample 2,
so 32 rollouts per prompt, responses up to 12,288 tokens) on 64 ranks over 8 nodes. Response
lengths are uniform in [256, 12288] (mean ~6.3K, ~100M tokens a step, the scale of the issue's
estimate); a tenth of each response is a tool response (loss mask 0); decoded text ~4 characters
per token. Hosts are processed one at a time, twice (summaries first, then the parts, which
need every host's summary), so the memory is one host's trajectories.

    python benchmarks/timing/bench_exchange.py                        # stage 2 (a few minutes)
    python benchmarks/timing/bench_exchange.py --prompts 64 --ranks 16 --nodes 2 --max-len 2048
"""
from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.config import load_recipe_dict  # noqa: E402
from rstar2_cli.rl.ranks.rollout_hosts import node_shard  # noqa: E402
from rstar2_cli.rl.ranks.exchange import Plan  # noqa: E402
from rstar2_cli.rl.selection.host_selection import GradedBatch, select_on_host  # noqa: E402
from rstar2_cli.rollout.trajectory import Trajectory  # noqa: E402

VOCAB = 151_936          # Qwen3's vocabulary (token ids up to it)
PROMPT_TOKENS = 200


def trajectory(pos: int, sample: int, min_len: int, max_len: int) -> Trajectory:
    """A graded synthetic trajectory of prompt position `pos` (the same every time it is built)."""
    rng = np.random.default_rng([pos, sample])
    n = int(rng.integers(min_len, max_len + 1))
    mask = np.ones(n, np.int64)
    start = int(rng.integers(0, n - n // 10 + 1))
    mask[start:start + n // 10] = 0
    logprobs = np.where(mask == 1, -rng.random(n), 0.0)
    calls = int(rng.integers(0, 4))
    p_correct = np.random.default_rng(pos).uniform(0.1, 0.9)    # per prompt: most groups have both
    return Trajectory(prompt_id=f"q{pos}", sample_index=sample, group_index=pos,
                      prompt_ids=rng.integers(0, VOCAB, PROMPT_TOKENS).tolist(),
                      response_ids=rng.integers(0, VOCAB, n).tolist(), loss_mask=mask.tolist(),
                      logprobs=logprobs.tolist(), text="abc " * n + "<answer>1</answer>",
                      reward=float(rng.random() < p_correct), num_turns=calls + 1, num_tool_calls=calls,
                      num_tool_errors=int(rng.integers(0, calls + 1)), tool_time=0.1 * calls, finish_reason="stop",
                      policy_versions=[0] * (calls + 1))


def host_piece(node: int, args) -> tuple[list[int], list[Trajectory], dict[str, float]]:
    positions = node_shard(args.prompts, node, args.nodes)
    trajs = [trajectory(p, s, args.min_len, args.max_len) for p in positions for s in range(args.rollouts)]
    return positions, trajs, {"time/rollout": 1.0, "time/reward": 1.0}


def select(piece, node: int, cfg):
    """A rollout host's steps 4-5 (RoC, advantages) and its summary: the step's own call."""
    _, trajs, seconds = piece
    return select_on_host(GradedBatch(trajs, len(trajs), seconds), cfg, index=0, node=node)


def measure(args) -> dict:
    """The bytes a rank receives per step, old and new (see the module docstring)."""
    cfg = load_recipe_dict({"model": {"path": "m"}, "data": {"train": "t.jsonl"},
                            "train": {"group_size": args.rollouts // 2, "seed": 0, "ppo_mini_batches": 1},
                            "rollout": {"max_response_tokens": args.max_len},
                            "roc": {"enabled": True, "mode": "paper", "oversample": 2}})
    started = Stopwatch()
    old_pieces, summaries, tokens = [], [], 0
    for node in range(args.nodes):                 # pass 1: the old broadcasts, the new summaries
        piece = host_piece(node, args)
        tokens += sum(len(t.prompt_ids) + len(t.response_ids) for t in piece[1])
        old_pieces.append(len(pickle.dumps(piece, protocol=pickle.HIGHEST_PROTOCOL)))
        summaries.append(select(piece, node, cfg).summary)
    plan = Plan(summaries, args.ranks, 1)
    per_node = args.ranks // args.nodes
    summary_bytes = [len(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)) for s in summaries]
    new = [0] * args.ranks
    for node in range(args.nodes):                 # pass 2: each host's scatter, padded to its largest part
        chosen = select(host_piece(node, args), node, cfg)
        kept, advantages = chosen.kept, chosen.advantages
        parts = [len(pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL)) for p in plan.payloads(node, kept, advantages)]
        for r in range(args.ranks):
            if r != node * per_node:               # a host receives nothing from itself
                new[r] += max(parts) + summary_bytes[node]
    old = [sum(old_pieces) - (old_pieces[r // per_node] if r % per_node == 0 else 0) for r in range(args.ranks)]
    shapes = {k: v for k, v in vars(args).items() if k != "json"}
    return {"shapes": shapes, "tokens_per_step": tokens, "kept": len(plan.lengths),
            "old_bytes_per_rank_max": max(old), "new_bytes_per_rank_max": max(new),
            "new_bytes_per_rank_mean": sum(new) / len(new), "ratio": max(new) / max(old),
            "seconds": started.elapsed()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=512, help="prompts per step (stage 2: 512)")
    ap.add_argument("--rollouts", type=int, default=32, help="rollouts per prompt, 2G (stage 2: 32)")
    ap.add_argument("--ranks", type=int, default=64, help="trainer ranks")
    ap.add_argument("--nodes", type=int, default=8, help="nodes, one rollout host each")
    ap.add_argument("--min-len", type=int, default=256, help="shortest response (tokens)")
    ap.add_argument("--max-len", type=int, default=12288, help="longest response (stage 2: 12288)")
    add_json_option(ap, help="also write the figures here, as JSON")
    args = ap.parse_args()
    if args.ranks % args.nodes:
        ap.error(f"--ranks {args.ranks} is not a multiple of --nodes {args.nodes}")
    out = measure(args)
    print(f"shapes: {args.prompts} prompts x {args.rollouts} rollouts, {args.ranks} ranks on {args.nodes} nodes, "
          f"responses {args.min_len}-{args.max_len} tokens: {out['tokens_per_step'] / 1e6:.1f}M tokens, "
          f"{out['kept']} kept")
    print(f"old: {out['old_bytes_per_rank_max'] / 2**20:,.1f} MiB received per rank per step")
    print(f"new: {out['new_bytes_per_rank_max'] / 2**20:,.2f} MiB (max over ranks), "
          f"{out['new_bytes_per_rank_mean'] / 2**20:,.2f} MiB mean")
    print(f"ratio new/old: 1/{1 / out['ratio']:.0f} ({out['seconds']:.0f} s)")
    write_json(args.json, out)


if __name__ == "__main__":
    main()
