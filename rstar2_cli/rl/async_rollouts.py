"""Asynchronous GRPO-RoC: the rollouts of later steps run while the current step trains.

`train.max_staleness` = k >= 1 (k = 0 is the synchronous step and never reaches this module).

The rule (docs/async-rl.md, "in order"): batch b, the sampler's b-th batch, may be rolled out once
the engines hold version >= b - k, i.e. from the start of step b - k; step b trains exactly batch
b, once every group of it is complete. So the data order is the synchronous run's (resume and RoC
see the same batches), RoC always selects within complete groups, and only the weights that
sampled a batch differ: by at most k versions. Version v = the weights after v optimizer steps;
a trajectory's staleness at step s is s minus the oldest version among its turns. Nothing can
exceed k under this rule, but the bound is checked where it matters, at training: a group with
any member staler than k is dropped whole and counted (a resumed or restored run, or a bug, must
not slip stale data into the loss).

Why whole groups are dropped: GRPO's advantages and RoC's selection are defined over the group;
training on a part of it would change both.

Why the rollouts keep running through weight updates instead of waiting for a batch boundary:
with k >= 2 several batches are in flight at once and would block every update. Each update
pauses the engines between requests (`engines.pause_for_update`), so a turn is always generated
by one version, while a multi-turn trajectory may span two (each turn's version is recorded).
"""
from __future__ import annotations

import concurrent.futures
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar2_cli.rollout.trajectory import Trajectory

# What a rollout host produces for one batch: (positions of its node-shard in the batch,
# trajectories graded, {"time/rollout": s, "time/reward": s}); None on ranks that are not hosts.
Piece = tuple[list[int], list[Trajectory], dict[str, float]]


@dataclass
class PendingBatch:
    index: int                                      # the batch's number = the step that trains it
    problems: list[int]                             # indices into the training problems
    future: concurrent.futures.Future | None = None   # this host's rollout of its shard
    piece: Piece | None = None                      # set when restored from a checkpoint

    def wait(self) -> Piece | None:
        """This host's piece, once its rollout is done (re-raises the rollout's error)."""
        return self.piece if self.future is None else self.future.result()


class RolloutPipeline:
    """The batches in flight, oldest first, admitted by the in-order rule, and what a checkpoint
    keeps of them.

    `sampler` is the run's DataSampler (drawn on every rank in the same order); `start(index,
    problems)` starts this host's rollout of batch `index` on the rollout thread and returns its
    future (None on ranks that roll nothing out)."""

    def __init__(self, max_staleness: int, total_steps: int, sampler: Any,
                 start: Callable[[int, list[int]], concurrent.futures.Future | None], *, first_index: int = 0):
        if max_staleness < 1:
            raise ValueError(f"RolloutPipeline needs max_staleness >= 1, got {max_staleness}")
        self.k, self.total_steps, self.sampler, self._start = max_staleness, total_steps, sampler, start
        self.pending: deque[PendingBatch] = deque()
        self.next_index = first_index
        self.dropped_groups_total = 0
        self._sampler_before: dict[int, dict] = {}   # batch index -> sampler state before its draw

    def fill(self, version: int) -> None:
        """Start every batch the rule admits at `version` (and that a step will train)."""
        while self.next_index < self.total_steps and self.next_index <= version + self.k:
            index = self.next_index
            self._sampler_before = {i: st for i, st in self._sampler_before.items() if i >= version}
            self._sampler_before[index] = self.sampler.state_dict()
            problems = self.sampler.next_batch()
            self.pending.append(PendingBatch(index, problems, self._start(index, problems)))
            self.next_index += 1

    def take(self, index: int) -> PendingBatch:
        """Batch `index`, which must be the oldest in flight; `.wait()` gives this host's piece."""
        if not self.pending or self.pending[0].index != index:
            have = [p.index for p in self.pending]
            raise RuntimeError(f"step {index} expects batch {index} first in flight, have {have}")
        return self.pending.popleft()

    def drain(self) -> None:
        """Wait for every batch in flight to finish (before a checkpoint: its rollouts are saved)."""
        for batch in self.pending:
            if batch.future is not None:
                batch.piece, batch.future = batch.future.result(), None

    def snapshot(self) -> list[tuple[int, list[int], Piece | None]]:
        """(index, problems, this host's piece) of every pending batch; call `drain` first."""
        if any(b.future is not None for b in self.pending):
            raise RuntimeError("snapshot of a pipeline with rollouts still running: drain() first")
        return [(b.index, list(b.problems), b.piece) for b in self.pending]

    def restore(self, batches: Sequence[tuple[int, list[int], Piece | None]], next_index: int) -> None:
        """Put saved batches back in flight (already complete), continuing at `next_index`."""
        self.pending = deque(PendingBatch(i, list(p), None, piece) for i, p, piece in batches)
        self.next_index = next_index

    def checkpoint_state(self, gather: Callable[[Any], list[Any]], is_host: bool) -> dict[str, Any]:
        """The rollouts drawn ahead, for the checkpoint: finished first (a short stall), then kept
        with their versions, so `--resume` trains exactly the batches the interrupted run would
        have and counts their staleness from the versions that really sampled them. `gather`
        collects every rollout host's part (all ranks call it: a collective)."""
        self.drain()
        snap = self.snapshot()
        per_host = gather(pending_to_state(snap) if is_host else None)
        first = snap[0][0] if snap else self.next_index
        return {"batches": [(i, p) for i, p, _ in snap], "hosts": per_host, "next_index": self.next_index,
                "sampler_before": self._sampler_before.get(first, self.sampler.state_dict()),
                "dropped_groups_total": self.dropped_groups_total}

    def load_checkpoint_state(self, saved: dict[str, Any], step: int, host_ordinal: int | None,
                              num_hosts: int) -> bool:
        """Put a checkpoint's rollouts back in flight (`host_ordinal`: this rank's place among
        the rollout hosts, None if it is not one). If they cannot be used as saved (another
        number of rollout hosts, or batches that do not start at `step`), rewind the sampler
        to regenerate them and return False."""
        batches, hosts = saved["batches"], saved["hosts"]
        self.dropped_groups_total = int(saved.get("dropped_groups_total", 0))
        if len(hosts) != num_hosts or [i for i, _ in batches] != list(range(step, step + len(batches))):
            rewind_for_regeneration(self.sampler, saved)
            self.next_index = step
            return False
        mine = (pending_from_state(hosts[host_ordinal]) if host_ordinal is not None
                else [(i, list(p), None) for i, p in batches])
        self.restore(mine, int(saved["next_index"]))
        return True

    def cancel(self) -> None:
        """Stop waiting for anything in flight (closing down)."""
        for batch in self.pending:
            if batch.future is not None:
                batch.future.cancel()
        self.pending.clear()


def rewind_for_regeneration(sampler: Any, saved: dict[str, Any]) -> None:
    """Move `sampler` back to where the saved rollouts-ahead were drawn, so they are drawn again
    (and rolled out again by the resumed weights)."""
    sampler.load_state_dict(saved["sampler_before"])


@dataclass
class StalenessReport:
    kept: list[Trajectory]
    histogram: Counter                              # staleness -> trajectories (before dropping)
    max_staleness: int = 1
    dropped_groups: int = 0
    dropped_trajectories: int = 0
    mixed_versions: int = 0                         # trajectories whose turns span two versions

    def metrics(self) -> dict[str, float]:
        n = sum(self.histogram.values())
        top = max(self.max_staleness, max(self.histogram, default=0))   # the same columns every step
        out = {f"async/staleness_{j}": float(self.histogram.get(j, 0)) for j in range(top + 1)}
        out.update({
            "async/staleness_mean": sum(j * c for j, c in self.histogram.items()) / n if n else 0.0,
            "async/staleness_max": float(max(self.histogram, default=0)),
            "async/dropped_groups": float(self.dropped_groups),
            "async/dropped_trajectories": float(self.dropped_trajectories),
            "async/mixed_version_trajectories": float(self.mixed_versions),
        })
        return out


def drop_stale_groups(trajs: Sequence[Trajectory], step: int, max_staleness: int) -> StalenessReport:
    """Keep the groups (by `group_index`) whose every trajectory is at most `max_staleness`
    versions older than the policy being trained at `step` (which holds version `step`)."""
    staleness = [step - t.policy_version for t in trajs]
    if any(s < 0 for s in staleness):
        bad = next(t for t, s in zip(trajs, staleness) if s < 0)
        raise RuntimeError(f"trajectory {bad.prompt_id}#{bad.sample_index} carries version "
                           f"{bad.policy_version}, newer than the policy at step {step}")
    stale_groups = {t.group_index for t, s in zip(trajs, staleness) if s > max_staleness}
    kept = [t for t in trajs if t.group_index not in stale_groups]
    return StalenessReport(kept=kept, histogram=Counter(staleness), max_staleness=max_staleness,
                           dropped_groups=len(stale_groups),
                           dropped_trajectories=len(trajs) - len(kept),
                           mixed_versions=sum(len(set(t.policy_versions)) > 1 for t in trajs))


def idle_metrics(step_s: float, trainer_wait_s: float, engine_busy_s: Sequence[float],
                 weight_pause_s: float) -> dict[str, float]:
    """Where `step_s` seconds of an asynchronous run went: the trainer waiting for its batch,
    each engine with nothing in flight (mean over replicas), the weight update's pause."""
    step_s = max(step_s, 1e-9)
    busy = [min(b, step_s) for b in engine_busy_s]
    return {"async/trainer_idle_frac": min(1.0, trainer_wait_s / step_s),
            "async/engine_idle_frac": 1.0 - sum(busy) / (len(busy) * step_s) if busy else 0.0,
            "async/weight_pause_s": weight_pause_s}


def pending_to_state(batches: list[tuple[int, list[int], Piece | None]]) -> list[dict[str, Any]]:
    """Pending batches as plain data for the checkpoint (trajectories as dicts)."""
    from dataclasses import asdict

    out = []
    for index, problems, piece in batches:
        stored = None if piece is None else (list(piece[0]), [asdict(t) for t in piece[1]], dict(piece[2]))
        out.append({"index": index, "problems": problems, "piece": stored})
    return out


def pending_from_state(state: list[dict[str, Any]]) -> list[tuple[int, list[int], Piece | None]]:
    out = []
    for entry in state:
        piece = entry["piece"]
        if piece is not None:
            piece = (list(piece[0]), [Trajectory(**t) for t in piece[1]], dict(piece[2]))
        out.append((int(entry["index"]), list(entry["problems"]), piece))
    return out
