"""benchmarks/timing/bench_agent_loop.py: its instant engine and tool have the real interfaces, and a
tiny run drives the real agent loop through every kind of turn and reports its figure, its garbage
collection and profile; `--against` measures another checkout and this one in turn."""
from __future__ import annotations

import gc
import json

import bench_agent_loop
import pytest
from api_contracts import assert_fake_methods_match

from rstar2_cli.rollout.engines import Engine, VLLMEngine
from sandbox.core.pool import Sandbox
from sandbox.service.client import RemoteSandbox


def test_the_canned_engine_has_the_real_engines_methods():
    assert_fake_methods_match(bench_agent_loop.CannedEngine, VLLMEngine,
                              ["generate", "kv_free_fraction", "update_weights", "reset_prefix_cache", "close"])
    assert isinstance(bench_agent_loop.CannedEngine({"answer": [[1]]}), Engine)


def test_the_instant_tool_has_the_sandboxes_methods():
    for real in (Sandbox, RemoteSandbox):        # what rollout/tool_sandbox.py builds
        assert_fake_methods_match(bench_agent_loop.InstantTool, real, ["run_batch", "close_session"])


def test_turn_kinds_follow_the_mix():
    kinds = [bench_agent_loop.turn_kind(s)[0] for s in range(20_000)]
    for kind, share in bench_agent_loop.MIX:
        assert abs(kinds.count(kind) / len(kinds) - share / 100) < 0.02, kind


def test_a_tiny_run_goes_through_every_kind_of_turn_and_writes_its_json(tmp_path):
    out_path = tmp_path / "out.json"
    out = bench_agent_loop.main(["--sizes", "64", "--profile-size", "32", "--profile-top", "5",
                                 "--turn-tokens", "24", "--json", str(out_path)])
    assert json.loads(out_path.read_text()) == out
    (run,) = out["runs"]
    kinds = run["turn_kinds"]
    assert run["trajectories"] == 64 and set(kinds) == {"tool_call", "parse_error", "answer", "void"}
    assert run["turns"] == sum(kinds.values())
    ends = run["finish_reasons"]
    assert set(ends) == {"stop", "max_turns"} and sum(ends.values()) == 64
    # every call attempt but a capped trajectory's last one is answered; the sandbox sees the well-formed ones
    assert run["tool_calls"] == kinds["tool_call"] + kinds["parse_error"] - ends["max_turns"]
    assert run["sandbox_calls"] < kinds["tool_call"] and run["void_turns"] >= kinds["void"] + 1
    assert 0 < run["reward_mean"] < 1 and run["turns_per_cpu_s"] > 0
    assert run["rollout_turns_per_cpu_s"] >= run["turns_per_cpu_s"]
    assert 0 <= run["gc_cpu_s"] <= run["rollout_cpu_s"] + run["grade_cpu_s"] and len(run["gc_collections"]) == 3
    prof = out["profile"]
    assert prof["trajectories"] == 32 and len(prof["top"]) == 5
    assert all(e["ncalls"] > 0 and 0 <= e["share"] <= 1 for e in prof["top"])


def test_the_gc_clock_counts_collections_in_its_block_only():
    with bench_agent_loop.GCClock() as clock:
        gc.collect()
        gc.collect(0)
    gc.collect()
    assert clock.collections[0] >= 1 and clock.collections[2] >= 1 and clock.seconds > 0
    assert clock not in gc.callbacks


@pytest.mark.slow
def test_against_runs_both_trees_in_turn_in_their_own_processes(tmp_path):
    """`--against`: each round runs the other checkout's bench, then this one, in fresh processes
    (here the same tree twice, so both sides count the same turns)."""
    out = bench_agent_loop.main(["--against", str(bench_agent_loop.REPO), "--rounds", "1", "--sizes", "32",
                                 "--turn-tokens", "24", "--json", str(tmp_path / "ab.json")])
    assert json.loads((tmp_path / "ab.json").read_text()) == out
    (row,) = out["rounds"]
    assert len(row["load_average"]) == 3 and out["before"] == out["after"]
    (before,), (after,) = row["before"], row["after"]
    assert before["trajectories"] == after["trajectories"] == 32 and before["turns"] == after["turns"]
    assert before["turns_per_cpu_s"] > 0 and after["turns_per_cpu_s"] > 0


def test_against_a_folder_that_is_not_a_checkout_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="is not a checkout with benchmarks/timing/bench_agent_loop.py"):
        bench_agent_loop.main(["--against", str(tmp_path)])
