"""Every RL step's rollouts on disk: a sample of its groups, one JSON line per trajectory.

Where: `<train.out_dir>/rollouts/step_NNNNNN.jsonl.gz` (the step number after the step, as
checkpoints are named), `step_NNNNNN.node<k>.jsonl.gz` per rollout host when there are several.
RoC and the advantages run on each rollout host over its own groups (`trainer.RLTrainer.train_step`), so
each host picks and renders its records there (`RolloutLog.pick`, right after its selection: only
the picked groups outlive the exchange) and writes its own file after the step (`write`): written
to `<name>.tmp`, then renamed, so a reader never sees half a file.

Which groups: `train.log_rollouts` of the host's groups (0: no file), drawn by a generator seeded
by (run seed, step, node), plus every group holding a trajectory excluded from training for a
fault (`rl/selection/exclusion.py`; a void-turn exclusion is a policy choice, not a fault).

One line per trajectory (`docs/rollouts.md` lists the keys; null where unknown): its identity, the
problem and gold answer, its turns (the agent loop's records, `rollout/agent_loop.py`: each turn's
token span decoded once here, with its call code and parse errors or its tool status; a trajectory
without records is split at its loss-mask runs), its counts and outcome, its exclusion
reason (`fault`), RoC's own decision and rule (`Trajectory.roc_decision`, `rl/selection/roc.py`) with p_err and p_format
as RoC's mode computes them (`roc.penalty_parts`), and its advantage where kept.
`logprob_gap` (engine against trainer log-probs) is null when picked: the trainer's log-probs
exist only on the training ranks, after the exchange. `logprob_gap.fill_logprob_gaps`, a
collective every rank calls after the update, sets it on each host's records before `write`.
"""
from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rstar2_cli.protocol.template import ids_decoder
from rstar2_cli.rl.selection.exclusion import VOID_TURN
from rstar2_cli.rl.update.logprob_gap import Gap, Label, fill_logprob_gaps
from rstar2_cli.rl.selection.roc import penalty_parts
from rstar2_cli.rollout.trajectory import Trajectory, TurnRecord


def rollout_path(out_dir: str | Path, step: int, node: int, nodes: int) -> Path:
    """The file of host `node` for step `step` (one host: no node in the name)."""
    name = f"step_{step:06d}.jsonl.gz" if nodes <= 1 else f"step_{step:06d}.node{node}.jsonl.gz"
    return Path(out_dir) / "rollouts" / name


def group_key(t: Trajectory) -> tuple[int, str]:
    """A sampled instance, as RoC groups (`roc.group_by_instance`)."""
    return t.group_index, t.prompt_id


def pick_groups(trajs: Sequence[Trajectory], count: int, *, seed: int, step: int, node: int) -> list[tuple[int, str]]:
    """`count` groups drawn by a generator seeded by (seed, step, node), plus every group with a
    trajectory excluded for a fault; in batch order."""
    keys = sorted({group_key(t) for t in trajs})
    if count <= 0 or not keys:
        return []
    rng = np.random.default_rng([seed, step, node])
    chosen = {keys[i] for i in rng.choice(len(keys), size=min(count, len(keys)), replace=False)}
    chosen |= {group_key(t) for t in trajs if t.exclusion not in (None, VOID_TURN)}
    return sorted(chosen)


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, end, mask value) of each run of equal loss-mask values."""
    runs: list[tuple[int, int, int]] = []
    for i, m in enumerate(mask):
        if runs and runs[-1][2] == m:
            runs[-1] = (runs[-1][0], i + 1, m)
        else:
            runs.append((i, i + 1, m))
    return runs


def render_turns(t: Trajectory, decode: Callable[[list[int]], str]) -> list[dict[str, Any]]:
    """The trajectory's turns as the log writes them, each span decoded once."""
    records = t.turn_records or [    # no agent-loop records: the loss-mask runs (1 = generated, 0 = tool/template)
        TurnRecord("assistant" if m else "tool", [s, e]) for s, e, m in mask_runs(t.loss_mask)]
    out = []
    for r in records:
        s, e = r.span
        turn = {"role": r.role, "text": decode(list(t.response_ids[s:e])), "tokens": e - s}
        if r.role == "assistant":
            turn.update(tool_code=r.tool_code, parse_error=r.parse_error)
        else:
            turn["status"] = r.status
        out.append(turn)
    return out


class RolloutLog:
    """Picks, renders and writes one host's sample of each step (module docstring)."""

    def __init__(self, out_dir: str | Path, problems: Sequence[Any], tokenizer: Any, *, count: int, seed: int,
                 roc_mode: str = "paper"):
        self.out_dir, self.count, self.seed, self.roc_mode = Path(out_dir), count, seed, roc_mode
        self.problems = {p.id: p.problem for p in problems} if count > 0 else {}
        self.decode = ids_decoder(tokenizer)

    def pick(self, trajs: Sequence[Trajectory], kept: Sequence[Trajectory], advantages: Sequence[float], *,
             step: int, node: int) -> list[dict[str, Any]]:
        """The records of this host's picked groups for step `step` (the number after the step)."""
        groups = set(pick_groups(trajs, self.count, seed=self.seed, step=step, node=node))
        if not groups:
            return []
        adv = {id(t): float(a) for t, a in zip(kept, advantages)}
        chosen = sorted((t for t in trajs if group_key(t) in groups), key=lambda t: (*group_key(t), t.sample_index))
        return [self.record(t, step, node, adv.get(id(t))) for t in chosen]

    def record(self, t: Trajectory, step: int, node: int, advantage: float | None) -> dict[str, Any]:
        d = t.roc_decision
        roc = {"decision": d and d.decision, "as": d and d.as_class, "rule": d and d.rule}
        p_err = p_format = None
        if roc["decision"] != "excluded":
            p_err, p_format = penalty_parts(t, self.roc_mode)
        return {"step": step, "node": node, "group": t.group_index, "prompt_id": t.prompt_id,
                "sample": t.sample_index, "problem": self.problems.get(t.prompt_id), "gold": t.gold,
                "turns": render_turns(t, self.decode), "response_tokens": t.response_length,
                "tool_calls": t.num_tool_calls, "tool_errors": t.num_tool_errors, "void_turns": t.num_void_turns,
                "finish_reason": t.finish_reason or None, "reward": t.reward, "extracted": t.extracted,
                "grade_reason": t.grade_reason or None, "fault": t.exclusion,
                "roc": {**roc, "p_err": p_err, "p_format": p_format}, "advantage": advantage,
                "logprob_gap": None}

    def write(self, step: int, node: int, nodes: int, records: Sequence[dict[str, Any]]) -> Path | None:
        """`records` to this host's file of step `step`, atomically; None (nothing written) when empty."""
        if not records:
            return None
        path = rollout_path(self.out_dir, step, node, nodes)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as f:
            f.write(body)
        os.replace(tmp, path)
        return path


class StepLog:
    """A step's rollout sample, on every rank (module docstring): picked on each rollout host
    right after its selection (`picker`, for `host_selection.select_on_host`), then, after the
    update, the trained trajectories' log-prob gaps joined in (`logprob_gap.fill_logprob_gaps`,
    a collective) and the host's file written (`write`). `log`: the host's `RolloutLog`, None on
    ranks that are not rollout hosts; `count`: `train.log_rollouts` (the same on every rank, so
    every rank joins the collective alike); `hosts`: the rollout hosts' ranks, in node order."""

    def __init__(self, log: RolloutLog | None, *, count: int, hosts: Sequence[int], rank: int, node: int):
        self.log, self.count, self.hosts, self.rank, self.node = log, count, list(hosts), rank, node
        self.records: list[dict[str, Any]] | None = None      # this host's picked records of the step

    def picker(self, step: int) -> Callable[[Sequence[Trajectory], Sequence[Trajectory], Sequence[float]], None]:
        """What a host's selection calls with (seen, kept, advantages) of step `step`."""
        def pick(seen: Sequence[Trajectory], kept: Sequence[Trajectory], advantages: Sequence[float]) -> None:
            self.records = self.log.pick(seen, kept, advantages, step=step, node=self.node)
        return pick

    def write(self, step: int, gaps: Mapping[Label, Gap], *, trained: bool) -> None:
        """Every rank, after the update (`trained`: the step trained anything; `gaps`: this rank's,
        `PolicyTrainer.update(...).gaps`)."""
        records, self.records = self.records, None
        if trained and self.count > 0:
            records = fill_logprob_gaps(records, gaps, hosts=self.hosts, rank=self.rank)
        if self.log is not None:
            self.log.write(step, self.node, len(self.hosts), records or [])
