"""One rollout host's cost of the rollout log per step (`rstar2_cli/rl/rollout_log.py`): picking the
logged groups among its trajectories, rendering them (each turn decoded once) and writing the file,
against the same step without the log (`train.log_rollouts: 0`), on synthetic trajectories.

Default shapes are stage 2's on one of 8 hosts (recipes/stage2.yaml: 512 prompts x 32 rollouts =
64 prompts x 32 per host, responses uniform in [256, 12288] tokens, ~6.3K mean; three generated
turns with two tool turns between them), `train.log_rollouts` 4 plus one faulted group, decoded
by the Qwen3-style byte-level BPE test tokenizer (`models/tiny.py`, vocabulary ~500: more bytes
per token than Qwen3's, so the decode and the file are on the large side).

    python benchmarks/timing/bench_rollout_log.py
    python benchmarks/timing/bench_rollout_log.py --prompts 8 --samples 8 --max-len 2048
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rstar2_cli.models.tiny import build_qwen3_style_tokenizer  # noqa: E402
from rstar2_cli.rl.rollout_log import RolloutLog  # noqa: E402
from rstar2_cli.rl.roc import decide  # noqa: E402
from rstar2_cli.rollout.trajectory import Trajectory, TurnRecord  # noqa: E402


def trajectories(prompts: int, samples: int, max_len: int, vocab: int, seed: int = 0) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    out = []
    for p in range(prompts):
        for s in range(samples):
            n = int(rng.integers(256, max_len + 1))
            ids = rng.integers(0, vocab, n).tolist()
            a, b = n // 3, 2 * n // 3
            tool = max(1, n // 20)
            mask = [1] * a + [0] * tool + [1] * (b - a - tool) + [0] * tool + [1] * (n - b - tool)
            turns = [TurnRecord("assistant", [0, a], tool_code="print(1)"),
                     TurnRecord("tool", [a, a + tool], status="ok"),
                     TurnRecord("assistant", [a + tool, b], tool_code="print(2)"),
                     TurnRecord("tool", [b, b + tool], status="error"), TurnRecord("assistant", [b + tool, n])]
            t = Trajectory(prompt_id=f"q{p}", sample_index=s, group_index=p, response_ids=ids, loss_mask=mask,
                           text="<answer>\\boxed{1}</answer>", reward=float(s % 2), num_turns=3, num_tool_calls=2,
                           num_tool_errors=1, finish_reason="stop", gold="1", extracted="1",
                           turn_records=turns)
            decide(t, "kept" if s % 4 < 2 else "dropped", "positive" if s % 2 else "negative", "synthetic")
            out.append(t)
    out[samples * 3].exclusion = "sandbox_internal_error"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=12288)
    ap.add_argument("--log-rollouts", type=int, default=4)
    args = ap.parse_args()
    tok = build_qwen3_style_tokenizer()
    trajs = trajectories(args.prompts, args.samples, args.max_len, len(tok))
    problems = [SimpleNamespace(id=f"q{p}", problem=f"problem {p} " * 40) for p in range(args.prompts)]
    kept = [t for t in trajs if t.roc_decision.decision == "kept"]
    with tempfile.TemporaryDirectory() as tmp:
        off = RolloutLog(tmp, problems, tok, count=0, seed=0)
        started = time.perf_counter()
        off.write(1, 0, 8, off.pick(trajs, kept, [0.5] * len(kept), step=1, node=0))
        off_s = time.perf_counter() - started
        log = RolloutLog(tmp, problems, tok, count=args.log_rollouts, seed=0)
        started = time.perf_counter()
        records = log.pick(trajs, kept, [0.5] * len(kept), step=1, node=0)
        picked = time.perf_counter() - started
        path = log.write(1, 0, 8, records)
        total = time.perf_counter() - started
        size = path.stat().st_size
    tokens = sum(r["response_tokens"] for r in records)
    print(json.dumps({"host_trajectories": len(trajs), "logged_trajectories": len(records), "logged_tokens": tokens,
                      "seconds_off": round(off_s, 4), "seconds_pick_render": round(picked, 3),
                      "seconds_total": round(total, 3), "file_bytes": size,
                      "bytes_per_logged_token": round(size / max(tokens, 1), 2)}))


if __name__ == "__main__":
    main()
