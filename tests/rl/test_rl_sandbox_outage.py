"""A remote sandbox that stays down: its calls are infrastructure failures that RoC leaves out of
the groups and of p_err, and an outage past `sandbox.outage_s` checkpoints and aborts the run."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_rl_instances import Engine, tok  # noqa: F401  (tok: the scripted engine's tokenizer fixture)

from rstar2_cli.config import ConfigError, RocConfig, RolloutConfig, load_recipe_dict
from rstar2_cli.rl.run.faults import NonfiniteSteps
from rstar2_cli.rl.selection.roc import error_penalty, select_for_training
from rstar2_cli.rl.run.rollout_side import Collaborators, sandbox_down_for
from rstar2_cli.rl.run.trainer import RLTrainer, RunAborted
from rstar2_cli.rollout.tool_sandbox import rl_tool_sandbox
from rstar2_cli.rollout.agent_loop import INFRA_TOOL_REASONS, run_agent_loop
from sandbox.service.client import RemoteSandbox


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_calls_failing_past_the_retries_are_not_the_models_tool_errors(tok, free_port):  # noqa: F811
    """Every call goes to a sandbox nothing listens on: after its retries it is an internal_error,
    which the agent loop counts as an infrastructure call and RoC drops with its trajectory."""
    problems = [("p", "What is 6*7?", "42")]
    engine = Engine(tok, {f"p#{k}": "print(42)" for k in range(4)})
    cfg = RolloutConfig(max_turns=4, max_response_tokens=2048, code_runner="plain")

    async def roll():
        async with RemoteSandbox(f"http://127.0.0.1:{free_port}", retries=1, backoff=0.01) as sb:
            return await run_agent_loop(problems, 4, engine, sb, tok, cfg, seed=3, progress=False), sb

    trajs, sb = asyncio.run(roll())
    assert all(reasons == ["internal_error"] for reasons in (t.tool_outcomes for t in trajs))
    assert "internal_error" in INFRA_TOOL_REASONS
    assert [(t.num_tool_calls, t.num_infra_tool_calls, t.num_tool_errors, t.infra_error) for t in trajs] == [
        (1, 1, 0, "sandbox_internal_error")] * 4
    assert [error_penalty(t) for t in trajs] == [0.5] * 4       # no call the model is accountable for
    roc = select_for_training(trajs, RocConfig(oversample=2), 2, np.random.default_rng(0))
    assert roc.trajectories == [] and roc.metrics["roc/infra_excluded_sandbox_internal_error"] == 4.0
    assert sb.outage.failures >= 1 and sb.outage.down_for() >= 0.0


def test_outage_s_is_validated_at_load():
    assert load_recipe_dict({"sandbox": {"outage_s": 90}}).sandbox.outage_s == 90.0
    with pytest.raises(ConfigError, match=r"sandbox.outage_s: .*greater than 0.*\(got 0\)"):
        load_recipe_dict({"sandbox": {"outage_s": 0}})


def _trainer(cfg, tools, step: int, saved_step: int) -> tuple[RLTrainer, list[int]]:
    """An RLTrainer with only what the abort checks touch: the recipe, the rollout side's sandbox,
    the step counters, the fault counters and a save() that records the step it saved."""
    trainer = object.__new__(RLTrainer)
    trainer.cfg, trainer.step, trainer.saved_step = cfg, step, saved_step
    trainer.side = SimpleNamespace(tools=tools)
    trainer.nonfinite, trainer.tool_loop_alarm = NonfiniteSteps(cfg.train.max_nonfinite_steps), None
    trainer.last_checkpoint = Path(f"run/step_{saved_step:06d}")
    saves: list[int] = []

    def save(final: bool = False) -> Path:
        saves.append(trainer.step)
        trainer.saved_step, trainer.last_checkpoint = trainer.step, Path(f"run/step_{trainer.step:06d}")
        return trainer.last_checkpoint

    trainer.save = save
    return trainer, saves


def test_an_outage_past_outage_s_checkpoints_and_aborts_with_one_line(free_port):
    clock = Clock()
    url = f"http://127.0.0.1:{free_port}"
    cfg = load_recipe_dict({"sandbox": {"url": url, "outage_s": 60}})

    async def scenario():
        async with RemoteSandbox(url, retries=0, clock=clock) as sb:
            trainer, saves = _trainer(cfg, sb, step=7, saved_step=5)
            for now in (0.0, 30.0):                  # failing for 30 s: under outage_s, the run goes on
                clock.now = now
                assert (await sb.run("print(1)")).reason == "internal_error"
            trainer._abort_if_needed()
            assert saves == [] and sb.outage.down_for() == 30.0
            clock.now = 61.0
            await sb.run("print(1)")
            with pytest.raises(RunAborted) as aborted:
                trainer._abort_if_needed()
            return str(aborted.value), saves

    message, saves = asyncio.run(scenario())
    assert saves == [7]
    assert message == (f"step 7: sandbox {url} down for 61s, every call failing (sandbox.outage_s=60); "
                       f"run/step_000007 holds step 7")
    assert "\n" not in message


def test_the_embedded_pool_has_no_outage_check():
    cfg = load_recipe_dict({})
    trainer, saves = _trainer(cfg, tools=object(), step=3, saved_step=0)
    trainer._abort_if_needed()
    assert saves == [] and sandbox_down_for(cfg, trainer.side.tools) == 0.0


@pytest.mark.slow
@pytest.mark.vllm
def test_the_run_checkpoints_and_exits_1_at_the_step_boundary_past_outage_s(tiny_model, tmp_path, monkeypatch,
                                                                            capsys, sandbox_server):
    """The trainer's loop asks after every step; the outage is reported as past outage_s after
    step 2 (the measure itself is tested above): step 2 is checkpointed, the run exits 1 with one
    line on stderr, and step 3 never runs."""
    from rl_synthetic import tiny_rl_recipe, write_times_seven

    from rstar2_cli.rl.run.launch_entry import run_for_exit_code

    answers = iter([0.0, 400.0])

    def tools(cfg):          # the real client, its outage measure answering 0 s, then 400 s
        sandbox = rl_tool_sandbox(cfg)
        sandbox.outage.down_for = lambda: next(answers)
        return sandbox

    data = write_times_seven(tmp_path / "train.jsonl", 4)
    out = tmp_path / "run"
    raw = tiny_rl_recipe(tiny_model, data, out, steps=3)
    raw["sandbox"] = {"url": sandbox_server, "outage_s": 300}
    code, final = run_for_exit_code(load_recipe_dict(raw), resume=False, collaborators=Collaborators(make_tools=tools))
    assert (code, final) == (1, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: step 2: sandbox {sandbox_server} down for 400s, every call failing "
                       f"(sandbox.outage_s=300); {out / 'step_000002'} holds step 2")
    assert (out / "step_000002").is_dir() and not (out / "step_000003").exists()


@pytest.fixture
def sandbox_server(monkeypatch):
    """`serve-sandbox`'s app on an embedded pool, in a thread (the sandbox tests' helpers): the RL
    run's remote sandbox."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "sandbox"))
    from service_fixtures import make_sandbox, serve_in_thread

    from sandbox.service.server import ServiceConfig, create_app

    with serve_in_thread(create_app(make_sandbox(workers=1), ServiceConfig())) as url:
        yield url
