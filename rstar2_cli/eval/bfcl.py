"""BFCL v3's AST categories (simple, multiple, parallel), checked by bfcl-eval's own AST checker.

Which categories run: the three single-turn Python AST categories, whose questions and ground
truth ship inside the bfcl-eval wheel (`bfcl_eval/data/BFCL_v4_{simple_python,multiple,
parallel}.json` and `possible_answer/`; BFCL v4 kept v3's AST sets and renamed the files). They
need no network. Not run: the executable categories (they call live REST APIs), the multi-turn,
memory and web-search categories (stateful backends, web access), the Java and JavaScript sets,
and the live_* sets (user-contributed questions; AST-checked and bundled too, but outside the
non-live simple / multiple / parallel row this module reports). So the number is BFCL's non-live
AST accuracy, not BFCL v3's overall score.

Protocol: one assistant turn. The question's messages are rendered with the release's chat
template and the question's functions in its `<tools>` block (as BFCL's Hermes handler does for
Qwen FC models); nothing is executed. The turn's `<tool_call>{"name", "arguments"}</tool_call>`
blocks become BFCL's call format `[{name: {param: value}}]` the way bfcl-eval's Hermes decoder
(QwenFCHandler.decode_ast) does: blocks that are not JSON objects are dropped, and a block
without a dict "arguments" makes the whole answer undecodable (BFCL: "ast_decoder:decoder_failed").
The decoded calls go to `ast_checker(functions, calls, ground_truth, Language.PYTHON, category,
model_name)`; a sample is correct when BFCL says "valid". Accuracy per category is BFCL's
correct / total; the headline is the unweighted mean over the three categories.
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

from rstar2_cli.data.problems import DataError, Problem, iter_rows
from rstar2_cli.eval.benchmarks import MathFamily, require_fields

CATEGORIES = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel"}   # ours -> BFCL file
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _json_lines(path: Path) -> list[dict[str, Any]]:
    """BFCL's .json data files hold one JSON object per line."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def package_rows(category: str) -> list[dict[str, Any]]:
    """bfcl-eval's own questions of one category, each with its ground truth and category."""
    from rstar2_cli.eval import reference

    root = reference.bfcl_data_dir()
    name = f"BFCL_v4_{CATEGORIES[category]}.json"
    answers = {row["id"]: row["ground_truth"] for row in _json_lines(root / "possible_answer" / name)}
    return [dict(q, ground_truth=answers[q["id"]], category=category) for q in _json_lines(root / name)]


def problem_from_row(row: dict[str, Any], where: str, lineno: int) -> Problem:
    require_fields(row, where, lineno, "id", "question", "function", "ground_truth")
    category = row.get("category") or next((c for c, f in CATEGORIES.items() if str(row["id"]).startswith(f)), None)
    if category not in CATEGORIES:
        raise DataError(f"{where}:{lineno}: field 'category' must be one of {', '.join(CATEGORIES)} "
                        f"(or the id must start with a BFCL category), got {row.get('category')!r}")
    question = row["question"]
    if not (isinstance(question, list) and question and isinstance(question[0], list)):
        raise DataError(f"{where}:{lineno}: field 'question' must be a list of message lists (BFCL's layout)")
    return Problem(str(row["id"]), json.dumps(question[0]), "", "bfcl",
                   {"category": category, "messages": question[0], "function": row["function"],
                    "ground_truth": row["ground_truth"]})


def decode_calls(text: str) -> list[dict[str, Any]] | None:
    """Hermes tool calls as BFCL's `[{name: arguments}]`; None when undecodable (see module doc)."""
    calls = []
    for body in _CALL.findall(text):
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            continue
        calls.append(obj)
    if any(not isinstance(c, dict) or not isinstance(c.get("arguments"), dict) or "name" not in c for c in calls):
        return None
    return [{c["name"]: dict(c["arguments"])} for c in calls]


def check(problem: Problem, text: str) -> dict[str, Any]:
    """bfcl-eval's verdict on one response: {"valid", "error", "error_type"}."""
    from rstar2_cli.eval import reference

    calls = decode_calls(text)
    if calls is None:
        return {"valid": False, "error": ["Failed to decode AST."], "error_type": "ast_decoder:decoder_failed"}
    checker = reference.bfcl_ast_checker()
    from bfcl_eval.constants.enums import Language

    return checker.ast_checker(problem.extra["function"], calls, problem.extra["ground_truth"], Language.PYTHON,
                               problem.extra["category"], reference.BFCL_MODEL_NAME)


def accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """BFCL's accuracy (correct / total) per category over every sample, and their mean."""
    per: dict[str, list[float]] = {}
    for r in rows:
        per.setdefault(r["category"], []).append(1.0 if r["reward"] > 0 else 0.0)
    out: dict[str, Any] = {c: statistics.fmean(v) for c, v in sorted(per.items())}
    out["overall"] = statistics.fmean(out[c] for c in per) if per else 0.0
    return out


class BFCLFamily(MathFamily):
    name = "bfcl"

    def load(self, s) -> list[Problem]:
        if s.data:
            return [problem_from_row(row, s.data, n) for n, row in iter_rows(Path(s.data))]
        return [problem_from_row(row, "bfcl_eval", n) for c in CATEGORIES for n, row in enumerate(package_rows(c), 1)]

    async def rollout(self, chunk: list[Problem], s, generator, tools, tokenizer) -> list:
        import asyncio

        from rstar2_cli.protocol.template import encode_messages, eos_token_ids
        from rstar2_cli.rollout.agent_loop import instance_key, trajectory_seed
        from rstar2_cli.rollout.engines import GenRequest
        from rstar2_cli.rollout.trajectory import Trajectory

        cfg = s.rollout_config()
        eos = eos_token_ids(tokenizer)

        async def one(p: Problem, k: int, group: int) -> Trajectory:
            messages = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []) + \
                list(p.extra["messages"])
            schemas = [{"type": "function", "function": f} for f in p.extra["function"]]
            prompt = encode_messages(tokenizer, messages, schemas, add_generation_prompt=True,
                                     force_reason=cfg.force_reason)
            t = Trajectory(prompt_id=p.id, sample_index=k, group_index=group, prompt_ids=prompt, gold="")
            req = GenRequest(prompt_ids=prompt, max_tokens=cfg.max_response_tokens, temperature=cfg.temperature,
                             top_p=cfg.top_p, stop_token_ids=eos, seed=trajectory_seed(s.seed, p.id, k) & 0x7FFFFFFF,
                             logprobs=False)
            try:
                res = await generator.generate(req, key=instance_key(p.id, k))
                t.response_ids, t.loss_mask = list(res.token_ids), [1] * len(res.token_ids)
                t.num_turns, t.finish_reason = 1, res.finish_reason
                t.text = tokenizer.decode(res.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                t.num_tool_calls = len(_CALL.findall(t.text))
            except Exception as e:  # one failed request is a failed sample, not a failed run
                t.finish_reason, t.extra["error"] = "error", repr(e)
            return t

        jobs = [one(p, k, g) for g, p in enumerate(chunk) for k in range(s.samples)]
        return list(await asyncio.gather(*jobs))

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        out = []
        for t in trajs:
            p = problems[t.prompt_id]
            verdict = check(p, t.text)
            out.append({"reward": 1.0 if verdict["valid"] else 0.0, "extracted": json.dumps(decode_calls(t.text)),
                        "grade_reason": "valid" if verdict["valid"] else verdict.get("error_type", "invalid"),
                        "category": p.extra["category"]})
        return out

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"bfcl": accuracy(rows)}


BFCL = BFCLFamily()
