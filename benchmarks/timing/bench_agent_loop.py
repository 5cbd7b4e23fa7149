"""The roll-out's own cost: turns per second of one core for the real agent loop, parser, tool-call
path, scheduler and grading, with engines and a tool that answer instantly.

What runs for real: `rollout/agent_loop.py` `run_agent_loop` (prompts and tool turns through
`protocol/splice.py`, one task per trajectory, turns and responses decoded through
`protocol/detokenize.py`, `protocol/parser.py`, the tool run items of `protocol/tools.py`, the tool
texts of `protocol/responses.py`), `rollout/scheduler.py` `LoadBalancedScheduler` over the
engines, and `reward.grade_batch` on the decoded texts, with stage 2's rollout and reward settings
(`rstar2_cli/recipes/stage2.yaml`) and the tiny tokenizer (`models/tiny.py`). What is canned:
`CannedEngine` (the `Engine` interface of rollout/generation.py, as `VLLMEngine` has it) answers
each turn at once with pre-tokenized ids, chosen by a hash of the request's seed (the loop gives
every turn a seed of its own, `agent_loop.trajectory_seed`), and `InstantTool` (the sandbox
interface `rollout/tool_sandbox.py` builds: `run_batch`, `close_session`) answers each call at once.

The turn mix, per turn: a well-formed tool call (50 %), a malformed call answered with the parse
error (8 %), an answer in `\\boxed{}` (37 %, right for half the problems), a void turn with
neither (5 %). A call continues the trajectory, so some reach stage 2's turn cap (5). A turn is
`--turn-tokens` generated ids on average (from 0.5x to 1.5x), plus its ending.

Sizes: one 8-GPU node's stage-2 step is 512 prompts x 32 rollouts (G = 16, RoC's oversample 2)
= 16,384 trajectories, orchestrated by one Python process over 4 engines (tensor parallel 2).
The figure: turns / CPU seconds of this process (rollout and grading; the grader's worker
processes, which take the texts with no box, are not counted; their wall time is), with the part
spent in Python's garbage collector (`gc_cpu_s`: the live trajectories are what a full collection
walks, so it grows faster than the step). A second, cProfile'd run of `--profile-size`
trajectories gives where the time goes.

    python benchmarks/timing/bench_agent_loop.py                          # 2,048 and 16,384
    python benchmarks/timing/bench_agent_loop.py --sizes 2048 --json out.json
    python benchmarks/timing/bench_agent_loop.py --against ../before-checkout --rounds 2   # before/after
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))   # harness

from harness import add_json_option, write_json  # noqa: E402
from rstar2_cli.config import RecipeConfig, load_recipe  # noqa: E402
from rstar2_cli.models.tiny import build_tokenizer, default_corpus  # noqa: E402
from rstar2_cli.protocol.parser import format_tool_call  # noqa: E402
from rstar2_cli.reward import grade_batch  # noqa: E402
from rstar2_cli.rollout.agent_loop import run_agent_loop  # noqa: E402
from rstar2_cli.rollout.generation import GenRequest, GenResult  # noqa: E402
from rstar2_cli.rollout.scheduler import LoadBalancedScheduler  # noqa: E402
from sandbox.core.result import RunResult  # noqa: E402

if TYPE_CHECKING:
    import torch

STAGE2 = REPO / "rstar2_cli" / "recipes" / "stage2.yaml"
TARGET_TURNS_PER_CPU_S = 5000
GROUP = 32                                   # rollouts per prompt in stage 2 (G = 16, oversample 2)
MIX = (("tool_call", 50), ("parse_error", 8), ("answer", 37), ("void", 5))   # per turn, in percent
VARIANTS = 8                                 # canned turns per kind (lengths 0.5x .. 1.5x)
SNIPPET = "from math import comb\nprint(comb(12, 5) % 97)"
PROSE = ("We need the remainder of {i} squared plus 17 modulo 97. First square the number: the square of {i} "
         "is computed step by step, then reduced. Note that 97 is prime, so the residues repeat with period "
         "97. Let me check the arithmetic carefully, since an error here changes the answer. ")
PROBLEM = "Let $n = {i}$. Find the remainder when $n^2 + 17$ is divided by 97."


def canned_turns(tokenizer, turn_tokens: int) -> dict[str, list[list[int]]]:
    """Pre-tokenized turns per kind, each ending on `<|im_end|>` (the release's only turn end)."""
    filler = tokenizer.encode("".join(PROSE.format(i=i) for i in range(3 * turn_tokens // 10 + 10)),
                              add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tails = {
        "tool_call": "\n<tool_call>" + format_tool_call("python_code_with_standard_io",
                                                        {"code": SNIPPET, "input": ""}) + "</tool_call>",
        "parse_error": '\n<tool_call>{"name": "python_code_with_standard_io", "arguments": {"code": '
                       '"print(1)"</tool_call>',
        "answer": "</reason>\n<answer>\\boxed{42}</answer>",
        "void": "",
    }
    out: dict[str, list[list[int]]] = {}
    for kind, tail in tails.items():
        tail_ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
        out[kind] = []
        for v in range(VARIANTS):
            n = max(1, turn_tokens * (VARIANTS + 2 * v) // (2 * VARIANTS))      # 0.5x .. ~1.4x
            start = (v * 997) % max(1, len(filler) - n)
            out[kind].append(filler[start:start + n] + tail_ids + [end])
    return out


def turn_kind(seed: int) -> tuple[str, int]:
    """The kind and variant of the turn whose request carries `seed` (a 64-bit mix of it)."""
    h = (seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF          # splitmix64's finaliser
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    h ^= h >> 31
    bucket, variant = (h >> 8) % 100, h % VARIANTS
    for kind, share in MIX:
        if bucket < share:
            return kind, variant
        bucket -= share
    raise AssertionError("MIX must add up to 100")


class CannedEngine:
    """An `Engine` (rollout/generation.py) that answers every request at once with canned ids."""

    def __init__(self, turns: dict[str, list[list[int]]], kv_capacity_tokens: int = 1 << 20):
        self.kv_capacity_tokens = kv_capacity_tokens
        self.results = {kind: [GenResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                                         stop_token_id=ids[-1]) for ids in variants]
                        for kind, variants in turns.items()}
        self.requests = Counter()

    async def generate(self, req: GenRequest) -> GenResult:
        await asyncio.sleep(0)               # one hop through the event loop, as an engine's future
        kind, variant = turn_kind(req.seed or 0)
        self.requests[kind] += 1
        return self.results[kind][variant]

    def kv_free_fraction(self) -> float:
        return 1.0

    async def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        return None

    async def reset_prefix_cache(self) -> None:
        return None

    async def close(self) -> None:
        return None


class InstantTool:
    """The tool sandbox's interface (sandbox.Sandbox: `run_batch`, `close_session`), answering at
    once: every fifth call fails with a traceback, the others print a number."""

    def __init__(self) -> None:
        self.calls = 0

    async def run_batch(self, items: list[dict], timeout: float | None = None) -> list[RunResult]:
        out = []
        for item in items:
            if "code" not in item:
                raise ValueError(f"run_batch item without 'code': {item!r:.80}")
            self.calls += 1
            out.append(RunResult(stdout="", stderr='Traceback (most recent call last):\n  File "<string>", line 1\n'
                                 "ZeroDivisionError: division by zero\n", exit_code=1, wall_time=0.03,
                                 reason="runtime_error") if self.calls % 5 == 0 else
                       RunResult(stdout="38\n", stderr="", exit_code=0, wall_time=0.02, reason="ok"))
        return out

    def close_session(self, session: str) -> None:
        return None


def problems(n_trajectories: int) -> list[tuple[str, str, str]]:
    """n / GROUP problems; gold 42 for even ones (the canned answer is right) and 17 for odd ones."""
    if n_trajectories % GROUP:
        raise SystemExit(f"--sizes: {n_trajectories} is not a multiple of {GROUP} rollouts per prompt")
    return [(f"p{i}", PROBLEM.format(i=i), "42" if i % 2 == 0 else "17") for i in range(n_trajectories // GROUP)]


class GCClock:
    """CPU seconds this process spends in the cyclic garbage collector, and its collections per
    generation (`gc.callbacks`), while in a `with` block."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, [0, 0, 0], 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.process_time()
        else:
            self.seconds += time.process_time() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> "GCClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def run(n: int, tokenizer, cfg: RecipeConfig, turns: dict, engines: int) -> dict:
    """One timed roll-out and grading of `n` trajectories; counts and CPU seconds of this process
    (of which `gc_cpu_s` in the garbage collector: the step's live trajectories are what a full
    collection walks, so it grows faster than the step)."""
    fleet = [CannedEngine(turns) for _ in range(engines)]
    tool = InstantTool()
    with GCClock() as collector:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        trajs = asyncio.run(run_agent_loop(problems(n), GROUP, LoadBalancedScheduler(fleet), tool, tokenizer,
                                           cfg.rollout, seed=0, progress=False))
        cpu1, wall1 = time.process_time(), time.perf_counter()
        grades = grade_batch([(t.text, t.gold) for t in trajs], timeout=cfg.reward.timeout, mode=cfg.reward.mode)
        cpu2, wall2 = time.process_time(), time.perf_counter()
    turns_total = sum(t.num_turns for t in trajs)
    requested = sum((e.requests for e in fleet), Counter())
    return {
        "trajectories": len(trajs), "turns": turns_total, "turn_kinds": dict(sorted(requested.items())),
        "tool_calls": sum(t.num_tool_calls for t in trajs), "sandbox_calls": tool.calls,
        "void_turns": sum(t.num_void_turns for t in trajs),
        "finish_reasons": dict(sorted(Counter(t.finish_reason for t in trajs).items())),
        "mean_response_tokens": round(sum(len(t.response_ids) for t in trajs) / len(trajs), 1),
        "reward_mean": round(sum(g.reward for g in grades) / len(grades), 4),
        "rollout_cpu_s": round(cpu1 - cpu0, 3), "grade_cpu_s": round(cpu2 - cpu1, 3),
        "rollout_wall_s": round(wall1 - wall0, 3), "grade_wall_s": round(wall2 - wall1, 3),
        "gc_cpu_s": round(collector.seconds, 3), "gc_collections": collector.collections,
        "turns_per_cpu_s": round(turns_total / max(cpu2 - cpu0, 1e-9)),
        "rollout_turns_per_cpu_s": round(turns_total / max(cpu1 - cpu0, 1e-9)),
    }


def profile(n: int, tokenizer, cfg: RecipeConfig, turns: dict, engines: int, top: int) -> dict:
    """`run` under cProfile: the `top` functions by own time, with their share of the total."""
    gc.collect()
    prof = cProfile.Profile()
    prof.enable()
    run(n, tokenizer, cfg, turns, engines)
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt                   # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]   # type: ignore[attr-defined]
    entries = []
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        where = path.replace(str(REPO) + "/", "").split("site-packages/")[-1]
        entries.append({"function": f"{where}:{line}({func})", "ncalls": ncalls, "tottime_s": round(tottime, 3),
                        "cumtime_s": round(cumtime, 3), "share": round(tottime / total, 3)})
    return {"trajectories": n, "total_s": round(total, 3), "top": entries}


def tree_runs(tree: Path, args: argparse.Namespace) -> list[dict]:
    """The runs of `tree`'s own copy of this bench, in a fresh process with `tree` on PYTHONPATH."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "runs.json"
        subprocess.run([sys.executable, str(tree / "benchmarks" / "timing" / "bench_agent_loop.py"),
                        "--sizes", args.sizes, "--turn-tokens", str(args.turn_tokens), "--engines", str(args.engines),
                        "--profile-size", "0", "--json", str(out)],
                       cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["runs"]


def describe(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    return f"{head or '?'} ({tree})"


def compare(against: Path, rounds: int, args: argparse.Namespace) -> dict:
    """`against` (before) and this tree (after), each in its own process, in turn, `rounds` times:
    the machine's load changes within minutes, so both are measured in one invocation."""
    if not (against / "benchmarks" / "timing" / "bench_agent_loop.py").is_file():
        raise SystemExit(f"--against: {against} is not a checkout with benchmarks/timing/bench_agent_loop.py")
    out: dict = {"before": describe(against), "after": describe(REPO), "rounds": []}
    for _ in range(rounds):
        load = [round(x, 2) for x in os.getloadavg()]
        out["rounds"].append({"load_average": load, "before": tree_runs(against, args), "after": tree_runs(REPO, args)})
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2048,16384", help="trajectories per run, comma-separated")
    ap.add_argument("--turn-tokens", type=int, default=400, help="mean generated ids per turn")
    ap.add_argument("--engines", type=int, default=4, help="engines behind the scheduler")
    ap.add_argument("--profile-size", type=int, default=2048, help="trajectories of the profiled run (0: none)")
    ap.add_argument("--profile-top", type=int, default=20)
    ap.add_argument("--against", type=Path, default=None,
                    help="a checkout to compare with: its bench and this one run in turn, each in its own process")
    ap.add_argument("--rounds", type=int, default=2, help="with --against: before/after pairs")
    add_json_option(ap)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if args.against is not None:
        return emit(compare(args.against.resolve(), args.rounds, args), args.json)
    cfg = load_recipe(STAGE2)
    tokenizer = build_tokenizer(default_corpus(0), 512)
    turns = canned_turns(tokenizer, args.turn_tokens)
    grade_batch([("no box here", "1")], timeout=cfg.reward.timeout, mode=cfg.reward.mode)  # grader workers up
    out = {"recipe": str(STAGE2.relative_to(REPO)), "max_turns": cfg.rollout.max_turns, "group": GROUP,
           "engines": args.engines, "turn_tokens": args.turn_tokens, "mix_percent": dict(MIX),
           "target_turns_per_cpu_s": TARGET_TURNS_PER_CPU_S,
           "runs": []}
    for n in sizes:
        gc.collect()                         # the previous run's trajectories are garbage by now
        out["runs"].append(run(n, tokenizer, cfg, turns, args.engines))
    if args.profile_size:
        out["profile"] = profile(args.profile_size, tokenizer, cfg, turns, args.engines, args.profile_top)
    return emit(out, args.json)


def emit(out: dict, path: Path | None) -> dict:
    print(json.dumps(out, indent=2))
    write_json(path, out, indent=2)
    return out


if __name__ == "__main__":
    main()
