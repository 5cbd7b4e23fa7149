"""Small RL run and eval folders in the formats `rstar2 inspect` reads (rollout rows in the RL
rollout schema, eval rows as eval/runner.py `sample_record` writes them)."""
from __future__ import annotations

import contextlib
import gzip
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rstar2_cli.protocol.parser import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from rstar2_cli.protocol.template import IM_END, IM_START, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN


def assistant(text: str, code: str | None = None, tokens: int = 30) -> dict[str, Any]:
    return {"role": "assistant", "text": text, "tokens": tokens, "tool_code": code, "parse_error": None}


def tool(text: str, status: str = "ok", tokens: int = 10) -> dict[str, Any]:
    return {"role": "tool", "text": text, "tokens": tokens, "status": status}


def trajectory(step: int, group: int, sample: int, *, reward: float, turns: list[dict], tool_errors: int = 0,
               fault: str | None = None, roc: dict | None = None, advantage: float | None = 0.5,
               void_turns: int = 0, node: int = 0) -> dict[str, Any]:
    calls = sum(1 for t in turns if t["role"] == "assistant" and t.get("tool_code"))
    return {"step": step, "node": node, "group": group, "prompt_id": f"p{group}", "sample": sample,
            "problem": f"What is {group} + {group}?", "gold": str(2 * group), "turns": turns,
            "response_tokens": sum(t["tokens"] for t in turns), "tool_calls": calls, "tool_errors": tool_errors,
            "void_turns": void_turns, "finish_reason": "stop", "reward": reward,
            "extracted": str(2 * group) if reward else "0", "grade_reason": "match" if reward else "mismatch",
            "fault": fault, "roc": roc or {"decision": "kept", "as": "positive" if reward else "negative",
                                           "rule": "lowest p_err", "p_err": 0.0, "p_format": 0.0},
            "advantage": advantage,
            "logprob_gap": {"mean_abs": 0.01, "max_abs": 0.2, "tokens": 60} if advantage is not None else None}


def clean_solution(step: int, group: int, sample: int) -> dict[str, Any]:
    return trajectory(step, group, sample, reward=1.0, turns=[
        assistant("Let me compute.", f"print({group} + {group})"), tool(f"Tool call success\nstdout: {2 * group}"),
        assistant(f"<answer>\\boxed{{{2 * group}}}</answer>")])


def error_positive(step: int, group: int, sample: int) -> dict[str, Any]:
    """Right answer after a failed tool call (the error RoC filters out of positives)."""
    return trajectory(step, group, sample, reward=1.0, tool_errors=1, turns=[
        assistant("Compute it.", f"print({group} + {group}"),
        tool("Tool call failure\nreason: \nstderr: SyntaxError: '(' was never closed", status="error"),
        assistant("Fix the bracket.", f"print({group} + {group})"), tool(f"Tool call success\nstdout: {2 * group}"),
        assistant(f"<answer>\\boxed{{{2 * group}}}</answer>")])


def write_rl_run(root: Path, steps: int = 3, groups: int = 2, samples: int = 4) -> Path:
    """An RL run folder: metrics.jsonl, resolved_recipe.yaml and one rollouts file per step, with a
    tool error in a positive, a faulted trajectory, a dropped negative, a repeated tool call and,
    in step 1, a log-prob gap 5x the step's (`train/logprob_abs_diff_vllm` 0.012)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "rollouts").mkdir(exist_ok=True)
    (root / "resolved_recipe.yaml").write_text("rl:\n  group_size: 4\n")
    rows = []
    for step in range(1, steps + 1):
        trajs = []
        for g in range(groups):
            for s in range(samples):
                if s == 0 and g == 0:
                    t = error_positive(step, g, s)
                elif s == 1:
                    t = trajectory(step, g, s, reward=0.0, turns=[
                        assistant("Try.", "print(1)"), tool("Tool call success\nstdout: 1"),
                        assistant("Again.", "print(1)"), tool("Tool call success\nstdout: 1"),
                        assistant("<answer>\\boxed{0}</answer> <script>alert(1)</script>")],
                        roc={"decision": "dropped", "as": "negative", "rule": "random negatives",
                             "p_err": None, "p_format": None}, advantage=None)
                elif s == 2 and g == 1 and step == 2:
                    t = trajectory(step, g, s, reward=0.0, fault="sandbox_timeout", advantage=None, turns=[
                        assistant("Loop.", "while True: pass"), tool("Tool call failure\nreason: worker_timeout",
                                                                     status="timeout")],
                        roc={"decision": "excluded", "as": None, "rule": "fault", "p_err": None, "p_format": None})
                else:
                    t = clean_solution(step, g, s)
                if (step, g, s) == (1, 1, 3):
                    t["logprob_gap"] = {"mean_abs": 0.06, "max_abs": 2.5, "tokens": 60}
                trajs.append(t)
        name = root / "rollouts" / f"step_{step:06d}.jsonl.gz"
        with gzip.open(name, "wt") as f:
            f.writelines(json.dumps(t) + "\n" for t in trajs)
        acc = sum(t["reward"] > 0 for t in trajs) / len(trajs)
        rows.append({"step": step, "rollout/reward_mean": acc, "rollout/accuracy": acc,
                     "rollout/response_length_mean": 80.0 + step, "rollout/tool_calls_mean": 1.5,
                     "rollout/tool_error_ratio": 0.1, "rollout/tool_error_ratio_positive": 0.05,
                     "train/logprob_abs_diff_vllm": 0.012})
    rows[-1]["eval/aime24/accuracy"] = 0.3
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def eval_text(group: int, fail_first: bool = False) -> str:
    call = TOOL_CALL_OPEN + json.dumps({"name": "python_code_with_standard_io",
                                        "arguments": {"code": f"print({group} * 2)", "input": ""}}) + TOOL_CALL_CLOSE
    result = ("Tool call failure\nreason: \nstderr: NameError: name 'x' is not defined" if fail_first
              else f"Tool call success\nstdout: {2 * group}\nexecution time: 0.01s")
    return (f"Let me check. {call}{IM_END}\n{IM_START}user\n{TOOL_RESPONSE_OPEN}\n{result}\n{TOOL_RESPONSE_CLOSE}"
            f"{IM_END}\n{IM_START}assistant\n<reason>So it is {2 * group}.</reason> <answer>\\boxed{{{2 * group}}}"
            f"</answer>{IM_END}")


def write_eval(folder: Path, benchmark: str = "aime24", problems: int = 2, samples: int = 2) -> Path:
    """An eval output folder: results.json and trajectories.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"problem_id": f"{benchmark}-{p}", "sample_index": s, "reward": float(s == 0), "extracted": str(2 * p),
             "grade_reason": "match" if s == 0 else "mismatch", "gold": str(2 * p), "response_tokens": 60,
             "generated_tokens": 40, "turns": 2, "tool_calls": 1, "tool_errors": int(s == 1),
             "finish_reason": "stop", "error": None, "text": eval_text(p, fail_first=s == 1)}
            for p in range(problems) for s in range(samples)]
    (folder / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "results.json").write_text(json.dumps({"benchmark": benchmark, "model": "tiny",
                                                      "metrics": {"avg@2": 0.5, "pass@2": 1.0}}))
    return folder


def write_big_run(root: Path, steps: int = 20, per_step: int = 100, group_size: int = 8) -> Path:
    """A synthetic run of `steps` x `per_step` trajectories with responses of a few thousand characters."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "rollouts").mkdir(exist_ok=True)
    reasoning = "We consider the sum of the first n odd numbers and check it numerically. " * 30
    code = "\n".join(f"total_{i} = sum(range({i}, {i} + 100))\nprint(total_{i})" for i in range(20))
    rows = []
    for step in range(1, steps + 1):
        trajs = [error_positive(step, k // group_size, k % group_size) if k % 5 == 0 else
                 trajectory(step, k // group_size, k % group_size, reward=float(k % 3 != 0), turns=[
                     assistant(reasoning, code, tokens=900), tool("Tool call success\nstdout: " + "4950\n" * 20),
                     assistant(reasoning + "<answer>\\boxed{4950}</answer>", tokens=800)])
                 for k in range(per_step)]
        with gzip.open(root / "rollouts" / f"step_{step:06d}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(t) + "\n" for t in trajs)
        rows.append({"step": step, "rollout/reward_mean": 0.5 + step / 100, "rollout/accuracy": 0.5 + step / 100,
                     "rollout/response_length_mean": 1800.0 - step, "rollout/tool_calls_mean": 1.2,
                     "rollout/tool_error_ratio": 0.2 - step / 200, "rollout/tool_error_ratio_positive": 0.1})
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@contextlib.contextmanager
def serving(folder: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`rstar2 inspect FOLDER --serve 0` running: (its address, the process); Ctrl-C at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "rstar2_cli.cli", "inspect", str(folder), "--serve", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("serving http://127.0.0.1:"):
            proc.kill()
            raise AssertionError(f"no address from --serve: {line!r} {proc.communicate()[1][-2000:]}")
        yield line.split()[1], proc
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
