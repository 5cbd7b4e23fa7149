"""Preemption without a model: the signal handlers and their grace clock, every rank stopping at the
same step, the launcher's forwarding to torchrun and its exit code, `--resume` parsing, and a
resumed run's metrics file."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE, PreemptionWatch, torchrun_env


def test_torchrun_reads_the_forwarded_signals_and_the_grace_from_the_environment(monkeypatch):
    """The names torchrun_env sets are the ones the installed torchrun reads its flags from."""
    from torch.distributed.run import get_args_parser

    monkeypatch.setenv("PET_NPROC_PER_NODE", "1")
    for name, value in torchrun_env(600.0).items():
        monkeypatch.setenv(name, value)
    args = get_args_parser().parse_args(["-m", "rstar2_cli.rl.run.launch_entry"])
    assert "SIGUSR1" in args.signals_to_handle.split(",") and "SIGTERM" in args.signals_to_handle.split(",")
    assert args.shutdown_timeout >= 600


def test_a_signal_only_marks_the_run_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGUSR1)
    watch = PreemptionWatch(grace_s=60).install()
    try:
        assert not watch.agreed()
        os.kill(os.getpid(), signal.SIGUSR1)     # default action would end this process
        assert watch.agreed() and watch.signal_name == "SIGUSR1"
    finally:
        watch.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_past_the_grace_the_process_exits_with_the_preempted_code(tmp_path):
    """A step that does not finish within preempt_grace_s: exit 75 anyway, before the cluster's kill."""
    code = textwrap.dedent("""
        import os, signal, time
        from rstar2_cli.rl.run.preemption import PreemptionWatch
        PreemptionWatch(grace_s=0.5).install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)          # a step that never ends
        raise SystemExit(0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr
    assert "train.preempt_grace_s=0.5" in out.stderr


def _agree_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    watch = PreemptionWatch(grace_s=60).install()
    seen = [watch.agreed()]                       # boundary 1: nobody signalled
    if rank == 1:
        os.kill(os.getpid(), signal.SIGUSR1)      # the signal reaches one rank only
    seen.append(watch.agreed())                   # boundary 2: both stop
    watch.uninstall()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


def test_every_rank_stops_at_the_same_step_when_only_one_was_signalled(tmp_path, free_port):
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_agree_worker, args=(free_port, str(tmp_path)), nprocs=2, start_method="fork",
                             join=False)
    while not ctx.join(timeout=120):
        pass
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert seen == [[False, True], [False, True]]


CHILD = textwrap.dedent("""
    import signal, sys, time, pathlib
    mode = sys.argv[1]
    if mode == "checkpoints":
        signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(75))
    elif mode == "finishes":
        signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(0))
    else:                                   # torchrun itself: dies non-zero on the signal
        signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(1))
    pathlib.Path(sys.argv[2]).write_text("ready")
    time.sleep(60)
""")


@pytest.mark.parametrize("mode,expected", [("checkpoints", PREEMPTED_EXIT_CODE), ("torchrun", PREEMPTED_EXIT_CODE),
                                           ("finishes", 0)])
def test_the_node_launcher_forwards_the_signal_and_exits_with_the_preempted_code(tmp_path, mode, expected):
    from rstar2_cli.rl.run.own_session import call_forwarding_signals

    ready = tmp_path / "ready"

    def signal_when_ready():
        while not ready.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGUSR1)     # as srun passes the batch script's USR1 on to us

    threading.Thread(target=signal_when_ready, daemon=True).start()
    code = call_forwarding_signals([sys.executable, "-c", CHILD, mode, str(ready)], dict(os.environ))
    assert code == expected


def test_without_a_signal_the_launcher_returns_the_child_code():
    from rstar2_cli.rl.run.own_session import call_forwarding_signals

    assert call_forwarding_signals([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3


def test_resume_values():
    from rstar2_cli.commands.rl import with_resume_default
    from rstar2_cli.rl.run.resume import resume_mode

    assert with_resume_default(["--resume"]) == ["--resume", "latest"]
    assert with_resume_default(["--resume", "auto", "r.yaml"]) == ["--resume", "auto", "r.yaml"]
    assert with_resume_default(["--resume", "r.yaml"]) == ["--resume", "latest", "r.yaml"]   # the old flag form
    assert [resume_mode(v) for v in (True, "latest", "auto", False, None)] == ["latest", "latest", "auto", None, None]
    with pytest.raises(ValueError, match="'soon'"):
        resume_mode("soon")


def test_rl_resume_reaches_every_node_command():
    from typer.testing import CliRunner

    from rstar2_cli.cli import app

    base = ["rl", "--stage", "1", "--gpus", "16", "--nodes", "2", "--master-addr", "h", "--dry-run"]
    runner = CliRunner()
    out = runner.invoke(app, base + ["--resume", "auto"], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert out.output.count("--resume auto") == 2
    out = runner.invoke(app, base + ["--resume"], terminal_width=400)
    assert out.exit_code == 0 and out.output.count("--resume latest") == 2
    out = runner.invoke(app, base + ["--resume=soon"])
    assert out.exit_code == 2 and "--resume 'soon'" in out.output


def test_resumed_metrics_drop_the_rows_written_after_the_checkpoint(tmp_path):
    from rstar2_cli.rl.logs.writer import MetricsWriter

    w = MetricsWriter(tmp_path)
    for step in range(4):
        w.write(step, {"rollout/accuracy": step / 4})
    w.keep_through(2)
    assert [json.loads(r)["step"] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    w.keep_through(None)                          # --resume auto with no checkpoint: a fresh start
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_fault_injection_plan_from_the_environment():
    """A trainer process started by `rstar2 rl` or torchrun reads its injected faults once, at start."""
    from rstar2_cli.rl.run.faults import FAULT_CHECKPOINT_WRITE_ENV, FAULT_NONFINITE_ENV, FaultPlan

    assert FaultPlan.from_env({}) == FaultPlan()
    plan = FaultPlan.from_env({FAULT_NONFINITE_ENV: "2, 5", FAULT_CHECKPOINT_WRITE_ENV: "3"})
    assert plan.nonfinite_steps == {2, 5} and plan.checkpoint_write_step == 3
    with pytest.raises(ValueError, match=FAULT_NONFINITE_ENV):
        FaultPlan.from_env({FAULT_NONFINITE_ENV: "two"})
    with pytest.raises(ValueError, match="RSTAR2_FAULT_CHECKPOINT_WRITE='two'"):
        FaultPlan.from_env({FAULT_CHECKPOINT_WRITE_ENV: "two"})


def test_every_node_command_tells_torchrun_to_forward_usr1_and_wait_for_the_checkpoint():
    from typer.testing import CliRunner

    from rstar2_cli.cli import app

    out = CliRunner().invoke(app, ["rl", "--stage", "1", "--gpus", "16", "--nodes", "2", "--master-addr", "h",
                                   "--set", "train.preempt_grace_s=100", "--dry-run"], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert out.output.count("PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1") == 2
    assert out.output.count("PET_SHUTDOWN_TIMEOUT=130") == 2


@pytest.mark.parametrize("raised,code", [("preempted", PREEMPTED_EXIT_CODE), ("aborted", 1), ("done", 0)])
def test_a_trainer_process_exits_with_the_outcome_code_and_one_line(tmp_path, monkeypatch, capsys, raised, code):
    from rstar2_cli.config import RecipeConfig, dump_recipe
    from rstar2_cli.rl.run import launch_entry
    from rstar2_cli.rl.run.preemption import Preempted
    from rstar2_cli.rl.run.trainer import RunAborted

    def fake_run(cfg, *, resume, collaborators):
        assert resume == "auto"
        if raised == "preempted":
            raise Preempted(3, tmp_path / "step_000003", "SIGUSR1")
        if raised == "aborted":
            raise RunAborted("step 5: 3 steps in a row with a non-finite loss")
        return tmp_path / "final"

    monkeypatch.setattr(launch_entry, "run", fake_run)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(dump_recipe(RecipeConfig()))
    assert launch_entry.main(["--config", str(recipe), "--resume", "auto"]) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == (0 if raised == "done" else 1)
    if raised == "preempted":
        assert "preempted by SIGUSR1 after step 3" in err and "--resume auto" in err


def test_ctrl_c_stops_at_the_step_boundary_and_a_second_one_later_stops_at_once(monkeypatch):
    """The first SIGINT only marks the run, as SIGTERM does; a repeat within INTERRUPT_REPEAT_S is the
    same keypress arriving twice (terminal and torchrun); a later one raises KeyboardInterrupt."""
    from rstar2_cli.rl.run import preemption

    monkeypatch.setattr(preemption, "INTERRUPT_REPEAT_S", 0.3)
    before = signal.getsignal(signal.SIGINT)
    watch = PreemptionWatch(grace_s=60).install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert watch.agreed() and watch.signal_name == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)      # the same keypress, forwarded: still finishing the step
        time.sleep(0.4)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)                        # the handler runs between bytecodes
    finally:
        watch.uninstall()
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("argv,expected", [
    (["rl", "r.yaml"], "rstar2 rl r.yaml --resume auto"),
    (["rl", "r.yaml", "--resume"], "rstar2 rl r.yaml --resume auto"),
    (["rl", "--resume", "latest", "r.yaml", "--set", "a=b c"], "rstar2 rl r.yaml --set 'a=b c' --resume auto"),
    (["rl", "--resume=auto", "--stage", "2"], "rstar2 rl --stage 2 --resume auto"),
])
def test_the_continue_command_is_the_same_command_with_resume_auto(argv, expected):
    from rstar2_cli.rl.run.preemption import continue_command

    assert continue_command(argv) == expected


def test_the_node_launcher_survives_ctrl_c_and_leaves_it_to_torchrun(tmp_path):
    """A terminal's SIGINT reaches torchrun itself: the launcher does not pass it on (torchrun would
    end its workers at once on a second one) and reports the preemption code torchrun ends with."""
    from rstar2_cli.rl.run.own_session import call_forwarding_signals

    ready = tmp_path / "ready"
    child = textwrap.dedent("""
        import pathlib, signal, sys, time
        signal.signal(signal.SIGINT, lambda s, f: pathlib.Path(sys.argv[1] + ".got").write_text("x"))
        pathlib.Path(sys.argv[1]).write_text("ready")
        time.sleep(2)
        sys.exit(75)
    """)

    def interrupt_when_ready():
        while not ready.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    code = call_forwarding_signals([sys.executable, "-c", child, str(ready)], dict(os.environ))
    assert code == PREEMPTED_EXIT_CODE
    assert not (tmp_path / "ready.got").exists()


COUNTING_CHILD = textwrap.dedent("""
    import signal, sys, time, pathlib
    seen = []
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    ready, count = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    ready.write_text("ready")
    while not seen:
        time.sleep(0.01)
    time.sleep(1.0)                          # the step and its checkpoint; a second signal would land here
    count.write_text(str(len(seen)))
    sys.exit(75)
""")


@pytest.mark.parametrize("under_srun", [True, False])
def test_under_srun_the_launcher_leaves_the_signal_to_slurm_so_torchrun_sees_it_once(tmp_path, monkeypatch,
                                                                                  under_srun):
    """slurmstepd signals every process of the step, torchrun included; the launcher passing the
    signal on too made torchrun see it twice (and end its workers at once on the second)."""
    from rstar2_cli.rl.run import own_session

    ready, count = tmp_path / "ready", tmp_path / "count"
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_STEP_ID", "SLURM_STEPID")}
    if under_srun:
        env["SLURM_STEP_ID"] = "3"
    children = []
    popen = subprocess.Popen
    monkeypatch.setattr(own_session.subprocess, "Popen", lambda *a, **kw: children.append(popen(*a, **kw))
                        or children[-1])

    def signal_the_step():                   # as slurmstepd does: every process of the task
        while not ready.exists():
            time.sleep(0.05)
        for pid in (os.getpid(), children[0].pid):
            os.kill(pid, signal.SIGUSR1)

    threading.Thread(target=signal_the_step, daemon=True).start()
    code = own_session.call_forwarding_signals([sys.executable, "-c", COUNTING_CHILD, str(ready), str(count)], env)
    assert code == PREEMPTED_EXIT_CODE
    assert count.read_text() == ("1" if under_srun else "2")
