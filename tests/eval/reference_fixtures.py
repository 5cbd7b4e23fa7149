"""The canned responses of tests/eval/fixtures/, read into what the graders and the reference
packages' own entry points take (shared by the reference-equality tests)."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

from rstar2_cli.rollout.trajectory import Trajectory

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def read_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def gpqa_cases():
    """(problems by id, trajectories, final turns) for every canned GPQA response, its letter
    placeholders filled from the question's recorded permutation."""
    from rstar2_cli.eval.gpqa import problem_from_row

    problems = {p.id: p for p in (problem_from_row(r, "gpqa_rows.jsonl", i)
                                  for i, r in enumerate(read_jsonl("gpqa_rows.jsonl"), 1))}
    trajs, finals, kinds = [], [], []
    for k, r in enumerate(read_jsonl("gpqa_responses.jsonl")):
        p = problems[r["id"]]
        gold = p.answer[1]
        wrong = next(c for c in "ABCD" if c != gold)
        text = (r["text"].replace("{GT}", p.extra["choices"][ord(gold) - 65])
                .replace("{WT}", p.extra["choices"][ord(wrong) - 65]).replace("{G}", gold).replace("{W}", wrong))
        trajs.append(Trajectory(prompt_id=p.id, sample_index=k, gold=p.answer, text=text))
        # what a single-turn harness is handed: the last assistant turn, without its end token
        finals.append(text.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>"))
        kinds.append(r["kind"])
    return problems, trajs, finals, kinds


def import_bfcl_runner():
    """bfcl-eval's own eval_runner and QwenFCHandler. Their modules import what the checker never
    calls for Qwen FC output and what the eval extra does not install: tree-sitter (the Java /
    JavaScript prompt parsers, stubbed as absent) and `overrides` (decorators, stubbed as
    identity)."""
    from rstar2_cli.eval import reference

    reference.bfcl_ast_checker()           # the model_config entry the checker reads
    for name, attr in (("bfcl_eval.model_handler.parser.java_parser", "parse_java_function_call"),
                       ("bfcl_eval.model_handler.parser.js_parser", "parse_javascript_function_call")):
        if name not in sys.modules:
            module = types.ModuleType(name)
            setattr(module, attr, None)
            sys.modules[name] = module
    if "overrides" not in sys.modules:
        module = types.ModuleType("overrides")
        module.final = module.override = lambda f: f
        module.EnforceOverrides = object
        sys.modules["overrides"] = module
    import bfcl_eval.eval_checker.eval_runner as runner
    import bfcl_eval.eval_checker.eval_runner_helper as helper
    from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler

    return runner, helper, QwenFCHandler
