"""BFCL's non-live single-turn categories, scored by bfcl-eval's own code.

Which categories run: every non-live category whose questions (and ground truth) ship inside the
bfcl-eval wheel and need no network (`CATEGORIES`): simple_python, simple_java,
simple_javascript, multiple, parallel, parallel_multiple and irrelevance (BFCL v4 kept v3's
non-live sets; `bfcl_eval/data/BFCL_v4_<category>.json`). Not run (`ABSENT`): the live_*
categories (user-contributed questions, bundled too, outside the non-live score), multi-turn
(stateful backends driven over several turns) and the executable categories (live REST APIs).
So the row is BFCL's non-live AST summary, not BFCL v3's overall score (the paper's row),
which averages the live and multi-turn groups as well.

Questions come from bfcl-eval's `load_dataset_entry`, which appends BFCL's language hint to
every function description (" Note that the provided function is in Python 3 syntax.", Java 8
SDK, JavaScript) and, for Java and JavaScript, rewrites parameter types as BFCL's prompts do.

Protocol: one assistant turn, the question's messages rendered with the release's chat template
and its functions in the `<tools>` block (as BFCL's Qwen FC handler does); nothing is executed.
Scoring is bfcl-eval's per-entry code (reference.bfcl_entry_checkers): the response's final turn
(after a `</think>`, as the handler keeps it) is decoded by QwenFCHandler.decode_ast (blocks
`<tool_call>\\n{...}\\n</tool_call>`, newlines required; a block that is not JSON is dropped; a
call without a dict "arguments" fails the decode), then `ast_checker` with the category's
language, or, for irrelevance, valid when no call decodes. Per category: correct / total over
every sample. Summary (eval_runner_helper.generate_leaderboard_csv, with its own
calculate_unweighted_accuracy): simple = mean(python, java, javascript); non-live AST =
mean(simple, multiple, parallel, parallel_multiple); irrelevance is reported beside it. A
category not run counts 0 in the summary and is listed as missing, as BFCL's formula does.
"""
from __future__ import annotations

import asyncio
import json
import re
from itertools import zip_longest
from pathlib import Path
from typing import Any

from rstar2_cli.data.problems import DataError, Problem, iter_rows
from rstar2_cli.eval import reference
from rstar2_cli.eval.family import MathFamily, final_turn, require_fields
from rstar2_cli.protocol.template import encode_messages, eos_token_ids
from rstar2_cli.rollout.agent_loop import instance_key, trajectory_seed
from rstar2_cli.rollout.generation import GenRequest
from rstar2_cli.rollout.trajectory import Trajectory

AST_CATEGORIES = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple")
CATEGORIES = (*AST_CATEGORIES, "irrelevance")
SIMPLE = ("simple_python", "simple_java", "simple_javascript")
SUMMARY = ("simple", "multiple", "parallel", "parallel_multiple")
ABSENT = {"live (live_simple, live_multiple, live_parallel, live_parallel_multiple, live_irrelevance, "
          "live_relevance)": "outside the non-live summary this row reports",
          "multi_turn (base, miss_func, miss_param, long_context)": "needs BFCL's stateful backends over several turns",
          "executable": "calls live REST APIs"}
_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)    # QwenFCHandler._extract_tool_calls


def category_of(test_id: str) -> str:
    """BFCL's category of a question id (`utils.extract_test_category_from_id`: "simple_java_3" -> "simple_java")."""
    return str(test_id).split(":")[0].rsplit("_", 1)[0]


def language_of(category: str) -> str:
    return "java" if category == "simple_java" else "javascript" if category == "simple_javascript" else "python"


def package_rows(category: str) -> list[dict[str, Any]]:
    """bfcl-eval's own questions of one category, each with its ground truth and category:
    `function` as BFCL prompts it (with its language hints) and `checker_function` as BFCL's
    checker reads it (eval_runner.evaluate_task loads the docs without the hints, and the Java /
    JavaScript types the hints rewrite to "string" are what its type checks key on)."""
    utils = reference.bfcl_utils()
    rows = utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=True)
    plain = {q["id"]: q["function"] for q in
             utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)}
    answers = [] if category == "irrelevance" else utils.load_ground_truth_entry(category)
    truth = {a["id"]: a["ground_truth"] for a in answers}
    return [dict(q, ground_truth=truth.get(q["id"]), checker_function=plain[q["id"]], category=category) for q in rows]


def problem_from_row(row: dict[str, Any], where: str, lineno: int) -> Problem:
    require_fields(row, where, lineno, "id", "question", "function")
    category = row.get("category") or category_of(row["id"])
    if category not in CATEGORIES:
        raise DataError(f"{where}:{lineno}: field 'category' must be one of {', '.join(CATEGORIES)} "
                        f"(or the id must start with one), got {category!r}")
    if category != "irrelevance":
        require_fields(row, where, lineno, "ground_truth")
    question = row["question"]
    if not (isinstance(question, list) and question and isinstance(question[0], list)):
        raise DataError(f"{where}:{lineno}: field 'question' must be a list of message lists (BFCL's layout)")
    return Problem(str(row["id"]), json.dumps(question[0]), "", "bfcl",
                   {"category": category, "messages": question[0], "function": row["function"],
                    "checker_function": row.get("checker_function") or row["function"],
                    "ground_truth": row.get("ground_truth")})


def model_result(text: str) -> str:
    """What BFCL's Qwen handler scores: the final turn, after its `</think>` when there is one."""
    turn = final_turn(text)
    return turn.split("</think>")[-1].lstrip("\n") if "</think>" in turn else turn


def check(problem: Problem, text: str) -> dict[str, Any]:
    """bfcl-eval's verdict on one response: {"valid": True} or {"valid": False, "error_type", "error", ...}."""
    from bfcl_eval.constants.enums import Language, ReturnFormat  # lazy: bfcl-eval is the optional eval-extra

    entry = {"id": problem.id, "question": [problem.extra["messages"]], "function": problem.extra["checker_function"]}
    category, handler, checkers = (
        problem.extra["category"],
        reference.bfcl_qwen_decoder(),
        reference.bfcl_entry_checkers(),
    )
    if category == "irrelevance":
        return checkers["relevance"](
            handler, problem.id, model_result(text), entry, reference.BFCL_MODEL_NAME, category
        )
    lang = language_of(category)
    return checkers["ast"](handler, problem.id, model_result(text), problem.extra["ground_truth"], entry,
                           reference.BFCL_MODEL_NAME, category, Language(lang), ReturnFormat(lang))


def accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """BFCL's per-category accuracy (correct / total over every sample) and its non-live summary."""
    unweighted = reference.bfcl_summary().calculate_unweighted_accuracy
    per: dict[str, list[float]] = {}
    for r in rows:
        per.setdefault(r["category"], []).append(1.0 if r["reward"] > 0 else 0.0)
    score = {c: ({"accuracy": sum(v) / len(v), "total_count": len(v), "display_accuracy": sum(v) / len(v)}
                 if (v := per.get(c)) else {"accuracy": 0, "total_count": 0, "display_accuracy": "N/A"})
             for c in CATEGORIES}
    score["simple"] = unweighted([score[c] for c in SIMPLE])
    summary = unweighted([score[c] for c in SUMMARY])
    out: dict[str, Any] = {c: score[c]["accuracy"] for c in (*CATEGORIES, "simple")}
    out["non_live_ast"] = summary["accuracy"]
    out["missing"] = [c for c in CATEGORIES if c not in per]
    return out


class BFCLFamily(MathFamily):
    name = "bfcl"

    def load(self, s) -> list[Problem]:
        """The bundled questions, categories interleaved (one of each in turn) so `--limit N`
        samples every category."""
        if s.data:
            return [problem_from_row(row, s.data, n) for n, row in iter_rows(Path(s.data))]
        per = [[problem_from_row(row, "bfcl_eval", n) for n, row in enumerate(package_rows(c), 1)] for c in CATEGORIES]
        return [p for group in zip_longest(*per) for p in group if p is not None]

    async def rollout(self, chunk: list[Problem], s, generator, tools, tokenizer) -> list:
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
                t.finish_reason, t.error = "error", repr(e)
            return t

        jobs = [one(p, k, g) for g, p in enumerate(chunk) for k in range(s.samples)]
        return list(await asyncio.gather(*jobs))

    def grade(self, trajs: list, problems: dict[str, Problem], s) -> list[dict[str, Any]]:
        decoder = reference.bfcl_qwen_decoder()
        out = []
        for t in trajs:
            p = problems[t.prompt_id]
            verdict = check(p, t.text)
            try:
                decoded = json.dumps(decoder.decode_ast(model_result(t.text), None, False))
            except Exception:   # BFCL's decode failure; the verdict says so
                decoded = None
            out.append({"reward": 1.0 if verdict["valid"] else 0.0, "extracted": decoded,
                        "grade_reason": "valid" if verdict["valid"] else verdict.get("error_type", "invalid"),
                        "category": p.extra["category"]})
        return out

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"bfcl": accuracy(rows)}


BFCL = BFCLFamily()
