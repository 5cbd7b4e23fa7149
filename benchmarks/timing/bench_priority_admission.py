"""Priority admission against FCFS on the real vLLM engine (CPU, tiny model).

The situation partial rollouts create: the next batch's first turns are already queued when the
oldest batch's trajectories come back from their tool calls with their next turn. Under vLLM's
FCFS those turns wait behind the whole queue; with `scheduling_policy="priority"` and
priority = batch index they go first. This measures, on one replica with `max_num_seqs` slots,
how long the old batch's turns take to finish (and the whole queue, which priority must not
slow), FCFS against priority, with the same requests in the same arrival order.

    python benchmarks/timing/bench_priority_admission.py --old 8 --new 48 --tokens 96
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.config import EngineConfig  # noqa: E402
from rstar2_cli.models.tiny import build_tiny_model  # noqa: E402
from rstar2_cli.rollout.engines import GenRequest, VLLMEngine  # noqa: E402


async def one_run(engine, prompt, args) -> dict:
    def req(priority):
        return GenRequest(prompt, max_tokens=args.tokens, temperature=0.0, ignore_eos=True, priority=priority)

    sw = Stopwatch()
    new = [asyncio.create_task(engine.generate(req(1))) for _ in range(args.new)]    # the next batch, queued
    await asyncio.sleep(0.05)
    old = [asyncio.create_task(engine.generate(req(0))) for _ in range(args.old)]    # back from their tools
    await asyncio.gather(*old)
    old_s = sw.elapsed()
    await asyncio.gather(*new)
    return {"old_batch_s": old_s, "all_s": sw.elapsed()}


def measure(policy: str, model: Path, prompt: list[int], args) -> dict:
    engine = VLLMEngine.from_config(str(model), EngineConfig(max_num_seqs=args.slots), max_model_len=512,
                                    seed=0, scheduling_policy=policy)
    try:
        runs = [asyncio.run(one_run(engine, prompt, args)) for _ in range(args.repeats)]
    finally:
        engine.shutdown()
    return {k: min(r[k] for r in runs) for k in runs[0]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=int, default=8, help="the old batch's turns, arriving last")
    ap.add_argument("--new", type=int, default=48, help="the next batch's turns, queued first")
    ap.add_argument("--slots", type=int, default=8, help="engine.max_num_seqs")
    ap.add_argument("--tokens", type=int, default=96, help="tokens per turn")
    ap.add_argument("--repeats", type=int, default=2, help="runs per policy (the fastest is kept)")
    add_json_option(ap)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", seed=0)
        prompt = AutoTokenizer.from_pretrained(model).encode("What is 12 + 30? Let me compute it with Python.")
        res = {p: measure(p, model, prompt, args) for p in ("fcfs", "priority")}
    res["old_batch_priority_vs_fcfs"] = res["priority"]["old_batch_s"] / res["fcfs"]["old_batch_s"]
    res["all_priority_vs_fcfs"] = res["priority"]["all_s"] / res["fcfs"]["all_s"]
    res["args"] = vars(args) | {"json": str(args.json)}
    print(json.dumps(res, indent=1))
    write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
