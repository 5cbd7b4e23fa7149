"""benchmarks/gpu/gpu_trainer_proof.py on CPU at small widths: it runs to its JSON, also with only the
lent GPU image's packages importable; every GPU-only check builds its arguments (the memory plan,
the FSDP2 policy, continue_optimizer) before it says it needs CUDA; and every check reports failure
when the quantity it compares is perturbed. The spawn-environment check fails an engine launch that
leaks torchrun's agent-store variable."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import gpu_trainer_proof as proof
import trainer_proof_io as proof_io
import trainer_proof_memory as proof_memory
import trainer_proof_model as proof_model
import trainer_proof_numerics as numerics

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"
GPU_ONLY = {"update_memory", "engine_headroom", "cuda_ipc"}
H100_GIB = 79.1          # an H100 80GB as torch reports it


@pytest.mark.parametrize("as_on_image", [False, True], ids=["venv", "gpu_image_packages"])
def test_cpu_run_reports_every_check_and_builds_the_gpu_ones(tmp_path, as_on_image):
    out, blocked = tmp_path / "proof.json", tmp_path / "blocked.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    args = [str(GPU / "gpu_trainer_proof.py"), "--device", "cpu", "--widths", "small", "--work", str(tmp_path),
            "--out", str(out)]
    prefix = [str(GPU / "gpu_image.py"), "--report", str(blocked)] if as_on_image else []
    run = subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["checks"]) == list(proof.CHECK_NAMES)
    firsts = [line.split()[0] for line in run.stdout.splitlines() if line.split()]
    assert [w for w in firsts if w in proof.CHECK_NAMES] == list(proof.CHECK_NAMES)     # one printed line per check
    for name, entry in report["checks"].items():
        if name in GPU_ONLY:
            assert entry["status"].startswith("skipped: needs CUDA"), (name, entry)
        else:
            assert entry["status"] == "pass", (name, entry)
    checks = report["checks"]
    assert checks["sharded_load"]["tensors_equal"] is True and checks["sharded_load"]["buffers"] >= 1
    assert checks["chunked_head"]["clip_frac_low"] > 0 and checks["chunked_head"]["clip_frac_high"] > 0
    assert checks["packed_attention"]["max_per_micro_batch"] >= 2 and checks["packed_attention"]["sharded"] is True
    assert checks["update_memory"]["planned_gib"] > 0 and checks["update_memory"]["card_gib"] == H100_GIB
    assert checks["engine_headroom"]["adamw_entries"] > 0        # continue_optimizer ran on the FSDP2 policy
    assert checks["dcp_checkpoint"]["adamw_entries"] > 0 and checks["dcp_checkpoint"]["hf_files"] >= 1
    assert checks["update_speed"]["tokens_per_s"] > 0
    assert report["sizing"]["14b_on_cards"][f"{H100_GIB:g} GiB"]["planned_gib"] <= proof_memory.PLAN_SHARE * H100_GIB
    assert not any(tmp_path.glob("rstar2_proof_*")), "the work folder is removed"
    if as_on_image:
        seen = json.loads(blocked.read_text())
        assert seen["blocked_loaded"] == [] and "pydantic" in seen["always_blocked"]


# ---------------------------------------------------------------- the GPU checks' arguments, built on CPU


def test_the_update_plan_is_built_and_sized_to_fit_the_card():
    widths = proof_model.WIDTHS["14b"]
    for gib in (H100_GIB, 139.8):
        fit = proof_memory.fit_update(widths, gib, checkpointing=True)
        assert fit["planned_gib"] <= proof_memory.PLAN_SHARE * gib and fit["layers"] >= 2
        planned, rows = proof_memory.plan_for(replace(widths, layers=fit["layers"]), fit["update_tokens"], gib, True)
        assert planned == pytest.approx(fit["planned_gib"], abs=0.01) and any("activations" in r[0] for r in rows)
    with pytest.raises(ValueError, match="no proof shape's plan fits"):
        proof_memory.fit_update(widths, 40.0, checkpointing=True)


def test_a_given_size_wins_and_the_cpu_uses_its_sizes():
    args = SimpleNamespace(layers=3, update_tokens=8192, checkpointing=True)
    sizes = proof_model.SIZES["14b"]
    assert proof_memory.choose_size(args, proof_model.WIDTHS["14b"], sizes, H100_GIB) == (3, 8192, "given")
    none = SimpleNamespace(layers=None, update_tokens=None, checkpointing=True)
    assert proof_memory.choose_size(none, proof_model.WIDTHS["14b"], sizes, None)[:2] == (sizes["layers"],
                                                                                        sizes["update_tokens"])
    layers, tokens, how = proof_memory.choose_size(none, proof_model.WIDTHS["14b"], sizes, H100_GIB)
    assert how == "fitted to the card" and (layers, tokens) == (2, 24576)


def test_the_policy_and_process_group_arguments_match_the_real_signatures(ctx):
    from rstar2_cli.rl.update.policy import PolicyTrainer

    kwargs = proof_model.policy_kwargs(ctx, micro_batch_tokens=1024, checkpointing=True)
    inspect.signature(PolicyTrainer).bind(**kwargs)
    assert kwargs["sharded"] is True and kwargs["model_cfg"].path == str(ctx.checkpoint)
    group = proof_model.process_group_args(torch.device("cuda"))
    inspect.signature(torch.distributed.init_process_group).bind(**group)
    assert (group["backend"], group["rank"], group["world_size"]) == ("nccl", 0, 1)
    assert proof_io.dcp_paths(Path("/w"))["state"].parent == Path("/w/step_000001")
    assert 0 < proof_memory.engine_utilization(replace(proof_model.WIDTHS["14b"], layers=2), H100_GIB) < 1


def test_the_policy_runs_fsdp2_on_one_rank_and_refuses_it_without_a_group(ctx):
    from torch.distributed.tensor import DTensor

    from rstar2_cli.rl.update.policy import PolicyTrainer

    policy = proof_model.policy_for(ctx, micro_batch_tokens=256)
    assert policy.sharded and all(isinstance(p, DTensor) for p in policy.model.parameters())
    kwargs = proof_model.policy_kwargs(ctx, proof_model.random_model(ctx, seed=0), micro_batch_tokens=256)
    torch.distributed.destroy_process_group()
    try:
        with pytest.raises(ValueError, match="sharded=True needs a process group"):
            PolicyTrainer(**kwargs)
    finally:
        proof_model.one_rank_group(ctx.device)


# ---------------------------------------------------------------- every check can fail


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    args = SimpleNamespace(device="cpu", widths="small", work=str(tmp_path_factory.mktemp("proof")), checkpointing=True,
                           steps=1, plan_gpu_gib=H100_GIB, peak_tflops=None, ipc_gib=0.01)
    context = proof_model.Context(args, layers=2, update_tokens=256)
    own = proof_model.one_rank_group(context.device)
    proof_model.build_random_checkpoint(context)
    yield context
    if own and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_sharded_load_fails_on_a_buffer_not_recomputed(ctx, monkeypatch):
    from rstar2_cli.rl.update import model_load

    assert numerics.check_sharded_load(ctx)["tensors_equal"]
    ctx.kept.pop("fsdp", None)
    monkeypatch.setattr(model_load, "_init_non_persistent_buffers", lambda model: None)
    with pytest.raises(proof_model.CheckFailed, match="inv_freq"):
        numerics.check_sharded_load(ctx)
    ctx.kept.pop("fsdp", None)


def test_sharded_load_verdict_fails_on_a_forward_off_the_reference():
    good = {"names_not_in_both_max_over_ranks": 0, "differing_max_over_ranks": 0, "differing": [],
            "names_not_in_both": [], "logits_rel_diff": 0.0}
    numerics.sharded_load_verdict(good)
    with pytest.raises(proof_model.CheckFailed, match="forward"):
        numerics.sharded_load_verdict(good | {"logits_rel_diff": 0.05})
    with pytest.raises(proof_model.CheckFailed, match="names not in both"):
        numerics.sharded_load_verdict(good | {"names_not_in_both_max_over_ranks": 1, "names_not_in_both": ["x"]})


def test_chunked_head_fails_when_its_ratios_stay_at_one(ctx, monkeypatch):
    monkeypatch.setattr(numerics, "OLD_LOGPROB_SPREAD", 0.0)
    with pytest.raises(proof_model.CheckFailed, match="ratios near 1"):
        numerics.check_chunked_head(ctx)


def test_chunked_head_fails_on_a_head_off_the_full_logits(ctx, monkeypatch):
    from rstar2_cli.rl.update import logprobs

    real = logprobs.token_logprobs_with_loss
    monkeypatch.setattr(logprobs, "token_logprobs_with_loss",
                        lambda hidden, *a, **k: real(hidden * 1.05, *a, **k))   # as a temperature slip would
    with pytest.raises(proof_model.CheckFailed, match="beyond the bf16 tolerance.*grad_max_rel_diff"):
        numerics.check_chunked_head(ctx)


def test_packed_attention_verdict_fails_on_a_leak_or_nothing_packed():
    good = {"max_per_micro_batch": 3, "packed_vs_alone_mean_abs": 0.0, "leak_mean_abs": 0.08}
    numerics.attention_verdict(good, 1e-4)
    for bad, words in (({"packed_vs_alone_mean_abs": 0.01}, "differ from each trajectory alone"),
                       ({"max_per_micro_batch": 1}, "nothing was packed"),
                       ({"packed_vs_alone_mean_abs": 5e-5, "leak_mean_abs": 1e-4}, "cannot tell them apart")):
        with pytest.raises(proof_model.CheckFailed, match=words):
            numerics.attention_verdict(good | bad, 1e-4)


@pytest.mark.parametrize("planned, passes", [(50.0, True), (58.8, True), (59.0, False), (49.9, False),
                                             (80.0, False)])
def test_update_memory_fails_outside_the_band_or_on_a_plan_beyond_the_card(planned, passes):
    figures = {"planned_gib": planned, "device_peak_gib": 50.0, "card_gib": H100_GIB}   # 50 / 0.85 = 58.82
    if passes:
        proof_memory.memory_verdict(figures)
    else:
        with pytest.raises(proof_model.CheckFailed):
            proof_memory.memory_verdict(figures)


def test_update_speed_fails_on_a_non_finite_update():
    good = {"loss": 0.1, "grad_norm": 1.0, "tokens_per_s": 10.0}
    proof_memory.speed_verdict(good)
    with pytest.raises(proof_model.CheckFailed, match="non-finite"):
        proof_memory.speed_verdict(good | {"grad_norm": float("nan")})


def test_dcp_round_trip_fails_when_a_loaded_weight_differs(ctx, monkeypatch, tmp_path):
    from rstar2_cli.rl.update import checkpoint

    real = checkpoint.load_model_weights

    def off_by_a_little(policy, hf_dir):
        real(policy, hf_dir)
        with torch.no_grad():
            next(policy.model.parameters()).to_local().add_(1e-3)

    monkeypatch.setattr(checkpoint, "load_model_weights", off_by_a_little)
    holder = proof_memory.run_update(ctx, tokens=256)
    make = lambda: proof_model.policy_for(ctx, proof_model.random_model(ctx, seed=1), micro_batch_tokens=256)  # noqa
    with pytest.raises(proof_model.CheckFailed, match="1 weights differ"):
        proof_io.dcp_round_trip(holder, make, tmp_path, ctx.free)


def test_the_fake_gpu_memory_has_the_real_ones_methods():
    def params(obj, name):
        return list(inspect.signature(getattr(obj, name)).parameters)

    names = ("available", "mem_get_info", "card_gib", "release")
    real, fake = proof_memory.DeviceMemory(torch.device("cuda")), FakeMemory(1.0, 0.0)
    assert [params(real, n) for n in names] == [params(fake, n) for n in names] == [[]] * len(names)
    real.release()          # the trainer's own release (colocated.py release_trainer_cache): a no-op without CUDA


class FakeMemory:
    """A 100 GiB GPU as the headroom check reads it: `free` GiB free, `freed` more after the release."""

    def __init__(self, free: float, freed: float):
        self.free, self.freed = free, freed

    def available(self):
        return True

    def card_gib(self):
        return 100.0

    def mem_get_info(self):
        return int(self.free * proof_model.GIB), 100 * proof_model.GIB

    def release(self):
        self.free += self.freed


@pytest.mark.parametrize("freed, passes", [(10.0, True), (0.0, False)])
def test_engine_headroom_fails_when_the_cache_is_not_released(ctx, freed, passes):
    ctx.kept.pop("dcp_folder", None)           # the check saves its own checkpoint with AdamW state
    needs = 100 * proof_memory.engine_utilization(ctx.shape, 100.0)
    memory = FakeMemory(free=needs - 5, freed=freed)
    if passes:
        figures = proof_memory.check_engine_headroom(ctx, memory)
        assert figures["free_before_release_gib"] < figures["engine_needs_gib"] <= figures["free_after_release_gib"]
        assert figures["adamw_entries"] > 0
    else:
        with pytest.raises(proof_model.CheckFailed, match="free after the release"):
            proof_memory.check_engine_headroom(ctx, memory)


def test_cuda_ipc_verdict_fails_when_the_memory_is_not_shared():
    proof_io.ipc_verdict({"child_sum_matches": True, "parent_sees_child_write": True})
    with pytest.raises(proof_model.CheckFailed, match="not one memory"):
        proof_io.ipc_verdict({"child_sum_matches": True, "parent_sees_child_write": False})


def test_a_failing_check_is_one_fail_line_with_its_figures(ctx, capsys):
    def failing(_ctx):
        raise proof_model.CheckFailed("measured 9 GiB > planned 8 GiB", {"planned_gib": 8.0})

    entry = proof.run_check("update_memory", failing, ctx)
    assert entry["status"] == "fail" and entry["planned_gib"] == 8.0
    assert capsys.readouterr().out.split()[:2] == ["update_memory", "fail"]


@contextmanager
def scrubbing(**_):
    saved = os.environ.pop(proof_io.AGENT_STORE_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[proof_io.AGENT_STORE_ENV] = saved


@contextmanager
def leaking(**_):
    yield


@pytest.mark.parametrize("scrub, passes", [(scrubbing, True), (leaking, False)])
def test_spawn_env_check_tells_a_scrubbed_launch_from_a_leaking_one(monkeypatch, scrub, passes):
    import rstar2_cli.rollout.engine_env as engine_env

    monkeypatch.setattr(engine_env, proof_io.SCRUB_FUNCTION, scrub, raising=False)
    monkeypatch.delenv(proof_io.AGENT_STORE_ENV, raising=False)
    if passes:
        figures = proof_io.spawn_env_check()
        assert figures["child_without_scrub"] == "True" and figures["child_in_scrub"] == "<unset>"
    else:
        with pytest.raises(AssertionError, match=proof_io.AGENT_STORE_ENV):
            proof_io.spawn_env_check()
    assert proof_io.AGENT_STORE_ENV not in os.environ          # the check leaves the environment as it was
