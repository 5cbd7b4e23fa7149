"""`rstar2 eval`: tool-integrated generation on a benchmark, graded exactly as in RL.

Generation uses the same agent loop, sandbox and grader as the RL trainer, so an eval number and
a training reward mean the same thing. Samples are graded and appended to `trajectories.jsonl`
chunk by chunk (about `CHUNK_TRAJECTORIES` trajectories at a time, enough to keep the engine
busy); a rerun with the same out dir skips problems whose samples are all
there (resume) and draws again the samples the infrastructure failed (an engine error; the report
counts them until then), and the metrics are always recomputed from the file, never from memory alone.

Engines: one vLLM replica per group in `gpu_groups` (launch/eval_engines.py plans them over every
visible GPU for the commands), each with its own engine seed, `seed` + its index: requests that
carry no seed of their own (`seed_requests` off, the GPU default) would otherwise draw alike on
every replica (vLLM's own data-parallel engines perturb a shared seed for the same reason:
vllm/utils/torch_utils.py `set_random_seed`). The scheduler spreads the requests over them.
"""
from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from rstar2_cli.config import EngineConfig
from rstar2_cli.eval.benchmarks import family_of
from rstar2_cli.eval.family import grade_in_thread
from rstar2_cli.eval.metrics import as_records, failure_of, per_problem_summary, summarize
from rstar2_cli.eval.reference import versions as reference_versions
from rstar2_cli.eval.report import print_report
from rstar2_cli.eval.settings import EvalSettings, context_length
from rstar2_cli.rollout import engines
from rstar2_cli.rollout.openai_engine import OpenAIEngine
from rstar2_cli.rollout.scheduler import LoadBalancedScheduler
from rstar2_cli.rollout.tool_sandbox import eval_tool_sandbox

TRAJ_FILE = "trajectories.jsonl"
RESULTS_FILE = "results.json"
CHUNK_TRAJECTORIES = 256


def default_out_dir(s: EvalSettings) -> Path:
    name = Path(s.model.rstrip("/")).name or "model"
    bench = s.benchmark if not s.data else Path(s.data).stem
    return Path("runs") / "eval" / f"{bench}-{name}"


def load_done(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Samples already written by an earlier (possibly interrupted) run, keyed by (id, index): the
    first row of each, unless it failed (`metrics.failure_of`) and a later row of it did not (a
    rerun redraws failed samples)."""
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if not path.is_file():
        return done
    with path.open() as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash mid-write: that sample is simply redone
            key = (rec["problem_id"], int(rec["sample_index"]))
            if key not in done or (failure_of(done[key]) and not failure_of(rec)):
                done[key] = rec
    return done


def sample_record(traj, grade: dict[str, Any]) -> dict[str, Any]:
    """One trajectories.jsonl row: the trajectory's stats and text, and its family's grade fields."""
    row = {
        "problem_id": traj.prompt_id,
        "sample_index": traj.sample_index,
        "reward": grade["reward"],
        "extracted": grade.get("extracted"),
        "grade_reason": grade.get("grade_reason"),
        "gold": traj.gold,
        "response_tokens": traj.response_length,
        "generated_tokens": int(sum(traj.loss_mask)),
        "turns": traj.num_turns,
        "tool_calls": traj.num_tool_calls,
        "tool_errors": traj.num_tool_errors,
        "finish_reason": traj.finish_reason,
        "error": traj.error,
        "infra_error": traj.infra_error or None,
        "text": traj.text,
    }
    row.update({k: v for k, v in grade.items() if k not in row})
    return row


def make_engines(s: EvalSettings) -> list:
    """The replicas `s` asks for, started one after another (each spawns its engine core under its
    own GPU visibility); an OpenAI-compatible server is one client. Started replicas are shut down
    if a later one fails to start."""
    if s.engine == "openai":
        return [OpenAIEngine(base_url=s.base_url, model=s.model)]
    max_len = context_length(s)
    cfg = EngineConfig(cpu_kvcache_space_gb=s.cpu_kvcache_space_gb, colocate=False,   # alone on its GPUs: no sleep
                       tensor_parallel_size=s.tensor_parallel_size)
    started: list = []
    try:
        for i, group in enumerate(s.gpu_groups or [None]):
            started.append(engines.VLLMEngine.from_config(s.model, cfg, max_model_len=max_len, seed=s.seed + i,
                                                          gpu_ids=tuple(group) if group else None,
                                                          seed_requests=s.seed_requests))
    except BaseException:
        for engine in started:
            engine.shutdown()
        raise
    return started


def engines_summary(s: EvalSettings, engine=None) -> dict[str, Any]:
    """How many replicas ran, at which TP, on which GPUs: those passed in (`engine`, one or a list),
    else those `s` asks for."""
    if engine is None:
        tp = s.tensor_parallel_size if s.engine == "vllm" else None
        return {"replicas": len(s.gpu_groups or [None]), "tensor_parallel_size": tp, "gpu_ids": s.gpu_groups}
    replicas = list(engine) if isinstance(engine, (list, tuple)) else [engine]
    ids = [getattr(e, "gpu_ids", None) for e in replicas]
    return {"replicas": len(replicas), "tensor_parallel_size": getattr(replicas[0], "tp_size", None),
            "gpu_ids": [list(g) for g in ids] if all(g is not None for g in ids) else None}


async def _generate(s: EvalSettings, family, problems, tokenizer, out_file: Path, engine=None, tools=None) -> None:
    """Roll out every problem that is not complete in `out_file`, appending chunk by chunk.

    `engine` / `tools`: an already running generator (or a list of them, which share the work
    through the load-balanced scheduler) and sandbox to reuse (the quickstart and the tests share
    one); otherwise they are started here and closed at the end."""
    async with AsyncExitStack() as stack:
        if engine is None:
            engine = make_engines(s)
            for e in engine:
                stack.push_async_callback(e.close)
        if tools is None:
            tools = eval_tool_sandbox(s.sandbox_url, s.rollout_config())   # RL's limits and runner
            await stack.enter_async_context(tools)

        generator = LoadBalancedScheduler(list(engine) if isinstance(engine, (list, tuple)) else [engine])
        per_chunk = max(1, CHUNK_TRAJECTORIES // s.samples)
        for start in range(0, len(problems), per_chunk):
            chunk = problems[start : start + per_chunk]
            trajs = await family.rollout(chunk, s, generator, tools, tokenizer)
            grades = await grade_in_thread(family, trajs, {p.id: p for p in chunk}, s)
            with out_file.open("a") as f:
                for t, g in zip(trajs, grades):
                    f.write(json.dumps(sample_record(t, g)) + "\n")


class EngineReuse:
    """One set of vLLM replicas per checkpoint across several `run_eval` calls (`eval all` runs
    seven benchmarks on one checkpoint: one load, not seven). `get(s)` starts the replicas of
    `s.model` (`make_engines`), closing the previous checkpoint's; None for --engine openai (a
    client, nothing to load)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.engines: list | None = None

    def get(self, s: EvalSettings):
        if s.engine != "vllm":
            return None
        key = (s.model, s.tensor_parallel_size, str(s.gpu_groups), s.seed_requests)
        if key != self.key:
            self.close()
            self.engines = make_engines(s)
            self.key = key
        return self.engines

    def close(self) -> None:
        for engine in self.engines or []:
            engine.shutdown()
        self.engines, self.key = None, None


def run_eval(s: EvalSettings, *, engine=None, tools=None, console=None) -> dict[str, Any]:
    """Run (or resume) one evaluation and write results.json; returns the results dict.

    `engine` (anything with `async generate(req)` and `kv_free_fraction()`, or a list of them) and
    `tools` (a started sandbox) may be passed in to reuse them across evaluations. Each sample's
    seed comes from its problem and index, so results do not depend on which engine ran it. The
    prompt layout (`system_prompt`, `tools_in_prompt`, `protocol`) is part of the settings, so
    results.json records it."""
    from transformers import AutoTokenizer  # lazy: transformers (~0.9 s); a finished eval's rerun needs no tokenizer

    out = Path(s.out_dir) if s.out_dir else default_out_dir(s)
    out.mkdir(parents=True, exist_ok=True)
    source = s.data or s.benchmark
    family = family_of(s.benchmark)
    problems = family.load(s)
    if s.limit:
        problems = problems[: s.limit]
    traj_path = out / TRAJ_FILE
    done = load_done(traj_path)
    todo = [p for p in problems if any((p.id, i) not in done or failure_of(done[p.id, i]) for i in range(s.samples))]
    started = time.time()
    if todo:
        tokenizer = AutoTokenizer.from_pretrained(s.tokenizer or s.model)
        # The sandbox pool and vLLM engines run their own event-loop threads, so a fresh loop
        # here can drive engines and sandboxes that callers started elsewhere.
        asyncio.run(_generate(s, family, todo, tokenizer, traj_path, engine=engine, tools=tools))
    wanted = {p.id for p in problems}
    rows = [r for (pid, idx), r in load_done(traj_path).items() if idx < s.samples and pid in wanted]
    records = as_records(rows)
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= s.samples]
    metrics = summarize(records, ks=ks)
    metrics.update(family.metrics(rows))
    results = {
        "benchmark": source,
        "family": family.name,
        "model": s.model,
        "num_problems": len(problems),
        "resumed_problems": len(problems) - len(todo),
        "generation_seconds": round(time.time() - started, 2),
        "engines": engines_summary(s, engine),
        "metrics": metrics,
        "reference": None if family.name == "math" else reference_versions(),
        "settings": s.model_dump(mode="json"),
        "per_problem": per_problem_summary(records),
    }
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=2))
    print_report(results, out, console)
    return results
