"""`rstar2 inspect`'s reader: RL run folders, eval folders (one benchmark and `eval all`'s tree),
the even sampling over steps, and bad input as one line."""
from __future__ import annotations

import gzip
import json

import pytest
from inspect_fixtures import eval_text, write_eval, write_rl_run

from rstar2_cli.inspector.eval_rows import split_turns, tool_code, tool_status
from rstar2_cli.inspector.reader import InspectError, allocate, read_folder, read_step


def test_an_rl_run_reads_steps_metrics_recipe_and_every_trajectory(tmp_path):
    data = read_folder(write_rl_run(tmp_path / "run"))
    assert data["kind"] == "rl" and data["total"] == data["shown"] == 24
    assert [s["name"] for s in data["sections"]] == ["step 1", "step 2", "step 3"]
    assert [r["step"] for r in data["metrics"]] == [1, 2, 3] and "group_size" in data["recipe"]
    step2 = data["sections"][1]
    assert step2["summary"]["rollout/accuracy"] == pytest.approx(0.625)
    faulted = [t for t in step2["trajectories"] if t["fault"]]
    assert len(faulted) == 1 and faulted[0]["roc"]["decision"] == "excluded"
    assert {t["roc"]["decision"] for t in step2["trajectories"]} == {"kept", "dropped", "excluded"}


def test_node_files_of_a_step_are_one_step(tmp_path):
    run = write_rl_run(tmp_path / "run", steps=1)
    one = run / "rollouts" / "step_000001.jsonl.gz"
    rows = gzip.open(one, "rt").read().splitlines()
    for k, part in enumerate((rows[:3], rows[3:])):
        with gzip.open(run / "rollouts" / f"step_000001.node{k}.jsonl.gz", "wt") as f:
            f.write("\n".join(part) + "\n")
    one.unlink()
    data = read_folder(run)
    assert len(data["sections"]) == 1 and data["sections"][0]["total"] == 8 and data["shown"] == 8


def test_the_cap_samples_evenly_over_steps_and_says_the_totals(tmp_path):
    data = read_folder(write_rl_run(tmp_path / "run", steps=3), max_trajectories=7)
    assert data["total"] == 24 and data["shown"] == 7
    assert [len(s["trajectories"]) for s in data["sections"]] == [3, 2, 2]
    assert [s["total"] for s in data["sections"]] == [8, 8, 8]


def test_on_demand_lists_the_steps_without_opening_a_rollouts_file(tmp_path):
    run = write_rl_run(tmp_path / "run")
    (run / "rollouts" / "step_000003.jsonl.gz").write_bytes(b"\x1f\x8b\x08garbage")    # read only when asked
    data = read_folder(run, max_trajectories=1, on_demand=True)
    assert data["on_demand"] and data["shown"] == 0 and data["total"] is None
    assert [(s["name"], s["url"], s["total"], s["trajectories"]) for s in data["sections"]] == [
        (f"step {i}", f"step/00000{i}.json", None, []) for i in (1, 2, 3)]
    assert data["sections"][0]["summary"]["train/logprob_abs_diff_vllm"] == 0.012 and "group_size" in data["recipe"]
    with pytest.raises(InspectError, match="step_000003.jsonl.gz: not a readable gzip file"):
        read_step(run, 3)
    assert read_step(run, 9) is None


def test_a_step_is_read_whole_node_after_node(tmp_path):
    run = write_rl_run(tmp_path / "run", steps=2)
    one = run / "rollouts" / "step_000002.jsonl.gz"
    rows = [json.loads(r) for r in gzip.open(one, "rt").read().splitlines()]
    for k, part in ((1, rows[:3]), (0, rows[3:])):
        with gzip.open(run / "rollouts" / f"step_000002.node{k}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    one.unlink()
    assert read_step(run, 2) == rows[3:] + rows[:3]
    assert read_folder(run, max_trajectories=3)["sections"][1]["total"] == 8      # the file page still samples


@pytest.mark.parametrize("counts, budget, expected", [
    ([10, 10, 10], 9, [3, 3, 3]),
    ([1, 10, 10], 9, [1, 4, 4]),           # what a small step leaves goes to the others
    ([5, 5], 100, [5, 5]),
    ([4, 4, 4, 4], 2, [1, 0, 1, 0]),       # fewer than the steps: evenly spaced ones
    ([0, 3], 2, [0, 2]),
    ([3, 3], 0, [0, 0]),
])
def test_allocate(counts, budget, expected):
    assert allocate(counts, budget) == expected


def test_an_eval_folder_is_cut_into_turns(tmp_path):
    data = read_folder(write_eval(tmp_path / "ev"))
    assert data["kind"] == "eval" and data["total"] == 4 and [s["name"] for s in data["sections"]] == ["aime24"]
    t = data["sections"][0]["trajectories"][1]          # sample 1: its tool call failed
    assert [turn["role"] for turn in t["turns"]] == ["assistant", "tool", "assistant"]
    assert t["turns"][0]["tool_code"] == "print(0 * 2)" and t["turns"][1]["status"] == "error"
    assert t["turns"][1]["text"].startswith("Tool call failure") and "<|im_" not in t["turns"][2]["text"]
    assert t["group"] == "aime24-0" and t["tool_errors"] == 1 and data["sections"][0]["summary"]["avg@2"] == 0.5


def test_an_eval_all_folder_has_one_section_per_benchmark(tmp_path):
    write_eval(tmp_path / "table" / "A" / "aime24")
    write_eval(tmp_path / "table" / "A" / "hmmt25", "hmmt25", problems=3)
    (tmp_path / "table" / "paper_table.json").write_text("{}")
    data = read_folder(tmp_path / "table")
    assert [s["name"] for s in data["sections"]] == ["A/aime24", "A/hmmt25"] and data["total"] == 10


def test_an_eval_line_cut_by_a_crash_is_skipped_and_counted(tmp_path):
    folder = write_eval(tmp_path / "ev")
    with (folder / "trajectories.jsonl").open("a") as f:
        f.write('{"problem_id": "cut')
    data = read_folder(folder)
    assert data["total"] == 4 and data["skipped"] == 1


def test_tool_turn_status_from_its_text():
    assert tool_status("Tool call success\nstdout: 1") == "ok"
    assert tool_status("Tool call failure\nreason: \nstderr: ZeroDivisionError") == "error"
    assert tool_status("Tool call failure\nreason: worker_timeout\nexecution time: 10.00s") == "timeout"
    assert tool_status("Tool call failure\nreason: internal_error") == "infra_error"
    assert tool_status("Error: <tool_call> was not closed with </tool_call>.") == "parse_error"
    assert tool_status("1\nTimeoutError: execution exceeded the time limit of 10 seconds.") == "timeout"
    assert tool_status("Traceback (most recent call last):\n  ...\nValueError: x") == "error"
    assert tool_status("42") == "ok"


def test_tool_code_of_a_call():
    assert tool_code('<tool_call>{"name": "p", "arguments": {"code": "x = 1"}}</tool_call>') == "x = 1"
    assert tool_code('<tool_call>{"name": "p", "arguments": "{\\"code\\": \\"y\\"}"}</tool_call>') == "y"
    assert tool_code("<tool_call>print(1") == "print(1"      # never closed: the raw text
    assert tool_code("no call") is None
    assert len(split_turns(eval_text(3))) == 3 and split_turns("") == []


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such folder"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "neither an RL run folder"),
    (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "not a folder"),
])
def test_a_folder_that_is_not_a_run(tmp_path, make, message):
    with pytest.raises(InspectError, match=message):
        read_folder(make(tmp_path))


def test_a_corrupt_or_cut_rollout_file_names_the_file(tmp_path):
    run = write_rl_run(tmp_path / "run")
    bad = run / "rollouts" / "step_000002.jsonl.gz"
    whole = bad.read_bytes()
    bad.write_bytes(whole[: len(whole) // 2])                      # cut mid-stream
    with pytest.raises(InspectError, match=r"step_000002\.jsonl\.gz: not a readable gzip file"):
        read_folder(run)
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(InspectError, match=r"step_000002\.jsonl\.gz: not a readable gzip file"):
        read_folder(run)
    with gzip.open(bad, "wt") as f:
        f.write('{"step": 2}\n{broken\n')
    with pytest.raises(InspectError, match=r"step_000002\.jsonl\.gz:2: not a JSON line"):
        read_folder(run)


def test_bad_metrics_and_results_name_the_file_and_line(tmp_path):
    run = write_rl_run(tmp_path / "run")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{oops\n')
    with pytest.raises(InspectError, match=r"metrics\.jsonl:2: not JSON"):
        read_folder(run)
    ev = write_eval(tmp_path / "ev")
    (ev / "results.json").write_text("{")
    with pytest.raises(InspectError, match=r"results\.json: not JSON"):
        read_folder(ev)


def test_a_run_with_metrics_only_has_no_steps(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/accuracy": 0.5}) + "\n")
    data = read_folder(tmp_path)
    assert data["kind"] == "rl" and data["sections"] == [] and data["total"] == 0 and len(data["metrics"]) == 1
