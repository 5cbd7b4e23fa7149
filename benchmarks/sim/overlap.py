"""Rollout/training overlap with bounded staleness, simulated on the replica cluster.

Why: a synchronous step waits for its slowest trajectory's chain of turns, and while it trains
the engines sit idle. Letting rollouts for the next steps run while a step trains hides both,
at the cost of training on trajectories sampled by older weights. This module measures, before
anyone builds it, how much step time that buys at cluster scale for a staleness bound k
(`train.max_staleness`), with the same replica model and dispatch policies as `simulate`.

The model (every choice is an assumption stated here and in docs/async-rl.md):
  * Version v = the weights after v optimizer steps. Step s trains on one batch of B groups
    (a group = one prompt's samples) and publishes version s + 1.
  * A group enters training only once all its samples are done. Its staleness at step s is
    s - (the oldest version that generated a first turn of its trajectories); a group with
    staleness > k is dropped (counted, never trained on).
  * Colocated placement (today's step; k must be 0): the engines use every GPU, then sleep while
    the trainer runs reward + train + sync on every GPU; batch s is submitted when version s is
    published. This is exactly `simulate` per step plus the trainer phases.
  * Separate placement: `engine_gpus` GPUs hold the engines, the rest train; train time scales
    as total / trainer GPUs (linear FSDP scaling: optimistic for the trainer side, so it does
    not flatter the overlap). On a new version each replica pauses as vLLM's
    `pause_generation(mode="wait"|"abort"|"keep")` does, loads the weights in `sync_s` and drops
    its prefix cache; under "wait" and "abort" turns never mix two versions, under "keep"
    (partial rollouts) a running turn stops, re-prefills and continues on the new weights, and
    its trajectory's staleness still counts from its oldest token.
  * consume="in_order": batch b may be generated with versions >= b - k, so it is submitted
    once version b - k is published, and step b trains on exactly batch b (the data order of
    the synchronous run; nothing can go stale). consume="completion": AReaL's rule, at most
    (v + k + 1) * B groups started and not dropped, and the trainer takes the first B groups to
    complete, dropping stale ones.
  * The push: `blocking_push=False` (the default) assumes the trainer hands the weights to a
    staging buffer and moves on while each replica drains and loads; `blocking_push=True` is
    what `WeightPusher(pause=True)` does today: the trainer's push returns only once every
    replica has paused (mode "wait": drained its running turns) and loaded, and the batches the
    new version admits start then.
  * Each replica serves older batches first (vLLM's priority scheduling, priority = batch), or,
    with `priority=False`, in arrival order (vLLM's default FCFS).
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal

from rstar2_cli.rollout.scheduler import LoadTracker
from sim.baselines import Policy
from sim.rollout import ReplicaCluster, ReplicaModel, UpdateMode
from sim.workload import TrajectoryPlan

Consume = Literal["in_order", "completion"]


@dataclass(frozen=True)
class PhaseTimes:
    """Trainer-side seconds of one step with every GPU of the cluster training."""
    reward_s: float
    train_s: float
    sync_s: float

    def __post_init__(self) -> None:
        for name in ("reward_s", "train_s", "sync_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"PhaseTimes.{name}: must be >= 0, got {getattr(self, name)}")

    @classmethod
    def from_ratios(cls, rollout_s: float, reward: float, train: float, sync: float) -> "PhaseTimes":
        """Phases given as multiples of the synchronous rollout time (time/<phase> / time/rollout)."""
        return cls(reward * rollout_s, train * rollout_s, sync * rollout_s)


@dataclass(frozen=True)
class Placement:
    """`engine_gpus` None: colocated (engines and trainer share all GPUs, one after the other)."""
    total_gpus: int
    tensor_parallel: int = 1
    engine_gpus: int | None = None

    def __post_init__(self) -> None:
        if self.total_gpus < 1 or self.tensor_parallel < 1:
            raise ValueError(f"Placement: total_gpus and tensor_parallel must be >= 1, got {self}")
        gpus = self.total_gpus if self.engine_gpus is None else self.engine_gpus
        if not 0 < gpus <= self.total_gpus or gpus % self.tensor_parallel:
            raise ValueError(f"Placement.engine_gpus: need 0 < engine GPUs <= {self.total_gpus} and a multiple of "
                             f"tensor_parallel={self.tensor_parallel}, got {gpus}")
        if self.engine_gpus is not None and self.engine_gpus == self.total_gpus:
            raise ValueError("Placement.engine_gpus: a separate placement leaves the trainer no GPU "
                             f"(engine_gpus={self.engine_gpus} of {self.total_gpus})")

    @property
    def colocated(self) -> bool:
        return self.engine_gpus is None

    @property
    def replicas(self) -> int:
        return (self.total_gpus if self.engine_gpus is None else self.engine_gpus) // self.tensor_parallel

    @property
    def trainer_gpus(self) -> int:
        return self.total_gpus if self.engine_gpus is None else self.total_gpus - self.engine_gpus


@dataclass(frozen=True)
class OverlapConfig:
    max_staleness: int = 0
    consume: Consume = "in_order"
    update_mode: UpdateMode = "wait"
    priority: bool = True             # older batches' turns first; False: FCFS
    blocking_push: bool = False       # the trainer waits for every replica to pause and load

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"OverlapConfig.max_staleness: must be >= 0, got {self.max_staleness}")
        if self.consume not in ("in_order", "completion"):
            raise ValueError(f"OverlapConfig.consume: 'in_order' or 'completion', got {self.consume!r}")


@dataclass
class StepRecord:
    step: int
    start_s: float
    end_s: float
    data_wait_s: float          # the trainer idle before this step, waiting for complete groups
    groups: int                 # groups trained on
    dropped_groups: int         # stale groups discarded when this step collected its batch


@dataclass
class OverlapResult:
    steps: list[StepRecord]
    staleness: Counter          # trained trajectories by staleness (versions)
    dropped_groups: int
    dropped_trajectories: int
    engine_idle_fraction: float
    trainer_idle_fraction: float
    preemptions: int
    recomputed_tokens: int
    aborted_tokens: int
    weight_loads: int
    continued_turns: int = 0            # "keep": turns stopped by an update and continued
    update_recomputed_tokens: int = 0   # "keep": context those turns re-prefilled
    tokens_by_staleness: Counter = field(default_factory=Counter)   # trained tokens by versions behind
    push_wait_s: float = 0.0            # blocking_push: trainer time spent waiting for the replicas to load
    first_version: list[int] = field(repr=False, default_factory=list)

    @property
    def total_s(self) -> float:
        return self.steps[-1].end_s if self.steps else 0.0

    def step_time_s(self, warmup: int = 0) -> float:
        """Mean step time after `warmup` steps (the pipeline fills during the first k + 1)."""
        if not 0 <= warmup < len(self.steps):
            raise ValueError(f"warmup must be in [0, {len(self.steps)}), got {warmup}")
        start = self.steps[warmup - 1].end_s if warmup else 0.0
        return (self.total_s - start) / (len(self.steps) - warmup)


def simulate_overlap(batches: list[list[TrajectoryPlan]], group_size: int, model: ReplicaModel, policy: Policy,
                     placement: Placement, phases: PhaseTimes, cfg: OverlapConfig = OverlapConfig(), *,
                     steps: int | None = None, max_response_tokens: int = 8192) -> OverlapResult:
    """Train `steps` steps (default: one per batch); batches past `steps` only keep the engines
    as busy as in the steady state. Each batch lists its groups' samples prompt-major."""
    k = cfg.max_staleness
    steps = len(batches) if steps is None else steps
    if placement.colocated and k > 0:
        raise ValueError(f"max_staleness={k} needs the engines on their own GPUs (Placement.engine_gpus): "
                         "colocated engines sleep while the trainer runs, so nothing overlaps")
    if not batches or group_size < 1 or any(len(b) != len(batches[0]) or len(b) % group_size for b in batches):
        raise ValueError(f"every batch needs the same number of trajectories, a multiple of group_size={group_size}")
    if not 1 <= steps <= len(batches):
        raise ValueError(f"steps must be in [1, {len(batches)}], got {steps}")
    B = len(batches[0]) // group_size
    n_groups = len(batches) * B
    step_s = phases.reward_s + phases.train_s * placement.total_gpus / placement.trainer_gpus + phases.sync_s
    cluster = ReplicaCluster(placement.replicas, model, policy, max_response_tokens=max_response_tokens,
                             tracker=LoadTracker(placement.replicas), update_mode=cfg.update_mode,
                             load_weights_s=0.0 if placement.colocated else phases.sync_s)
    members: list[list[int]] = [[] for _ in range(n_groups)]
    left = [group_size] * n_groups
    owner: list[int] = []
    batch_left = [B] * len(batches)
    ready: deque[int] = deque()        # complete groups, in completion order (consume="completion")
    state = dict(started=0, live=0, version=0, next_step=0, in_flight=0)
    trainer_free_at, train_event = 0.0, None      # train_event: (end time, step) of the step running
    records: list[StepRecord] = []
    staleness: Counter = Counter()
    tokens_by_staleness: Counter = Counter()
    dropped = [0, 0]                               # groups, trajectories
    pending_drops = 0
    push: list = []                                # blocking_push: [version, started at] while pushing
    push_wait = [0.0]

    def group_version(g: int) -> int:
        return min(cluster.first_version[i] for i in members[g])

    def admit(now: float) -> None:
        while state["started"] < n_groups:
            g = state["started"]
            b, p = divmod(g, B)
            if cfg.consume == "in_order" and b > state["version"] + k:
                return
            if cfg.consume == "completion" and state["live"] >= (state["version"] + k + 1) * B:
                return
            if p == 0 and state["in_flight"] == 0:
                policy.reset()           # nothing in flight: forget trajectory homes, as the trainer does
            for plan in batches[b][p * group_size:(p + 1) * group_size]:
                i = cluster.submit(plan, now, priority=b if cfg.priority else 0, key=f"b{b}/{plan.key}")
                owner.append(g)
                members[g].append(i)
            state["started"] += 1
            state["live"] += 1
            state["in_flight"] += group_size

    def collect(s: int) -> tuple[list[int], list[int]] | None:
        """(groups step s trains on, stale groups dropped now); None while its batch is incomplete.
        Staleness only grows with s, so a stale group is dropped at once."""
        if cfg.consume == "in_order":
            if batch_left[s]:
                return None
            candidates = list(range(s * B, (s + 1) * B))
            take = [g for g in candidates if s - group_version(g) <= k]
            stale = [g for g in candidates if s - group_version(g) > k]
        else:
            take, stale = [], []
            while ready and len(take) < B:
                g = ready.popleft()
                (stale if s - group_version(g) > k else take).append(g)
            if len(take) < B:                      # not enough yet: the fresh ones wait in line
                ready.extendleft(reversed(take))
                take = []
        for g in stale:
            dropped[0] += 1
            dropped[1] += len(members[g])
            state["live"] -= 1
        return take, stale

    def try_train(now: float) -> None:
        nonlocal train_event, pending_drops
        s = state["next_step"]
        if train_event is not None or push or s >= steps:
            return
        got = collect(s)
        if got is None:
            return
        take, stale = got
        pending_drops += len(stale)
        if stale:
            admit(now)                   # dropped groups free room under the staleness bound
        if not take:
            return
        for g in take:
            staleness.update(s - cluster.first_version[i] for i in members[g])
            for i in members[g]:
                for v, n in cluster.tokens_by_version[i].items():
                    tokens_by_staleness[s - v] += n
        records.append(StepRecord(s, now, now + step_s, now - trainer_free_at, len(take), pending_drops))
        pending_drops = 0
        train_event = (now + step_s, s)

    def push_done(t: float) -> None:
        """blocking_push: once every replica holds the pushed version, the trainer is free."""
        nonlocal trainer_free_at
        if not push or any(rep.weights < push[0] for rep in cluster.reps):
            return
        done = max([t, push[1]] + [rep.loaded_at for rep in cluster.reps])
        push_wait[0] += done - push[1]
        push.clear()
        trainer_free_at = done
        admit(done)
        try_train(done)

    admit(0.0)
    while state["next_step"] < steps:
        t_cluster = cluster.next_time()
        if train_event is not None and (t_cluster is None or train_event[0] <= t_cluster):
            now, s = train_event
            train_event, trainer_free_at = None, now
            state["next_step"], state["version"] = s + 1, s + 1
            cluster.publish(s + 1, now)
            if cfg.blocking_push and not placement.colocated:
                push[:] = [s + 1, now]
                push_done(now)
                continue
            admit(now)
            try_train(now)
            continue
        if t_cluster is None:
            raise RuntimeError(f"simulation stalled before step {state['next_step']} (no work and no trainer step)")
        done = cluster.process_next()
        if push:
            push_done(t_cluster)
        for i in done:
            g = owner[i]
            left[g] -= 1
            state["in_flight"] -= 1
            if left[g] == 0:
                batch_left[g // B] -= 1
                ready.append(g)
        if done:
            try_train(max(t_cluster, max(cluster.finished_at[i] for i in done)))
    end = records[-1].end_s
    busy = sum(min(r.busy_s, end) for r in cluster.reps)
    return OverlapResult(
        steps=records, staleness=staleness, dropped_groups=dropped[0], dropped_trajectories=dropped[1],
        engine_idle_fraction=1.0 - busy / (len(cluster.reps) * end),
        trainer_idle_fraction=sum(r.data_wait_s for r in records) / end,
        preemptions=sum(r.preemptions for r in cluster.reps),
        recomputed_tokens=sum(r.recomputed_tokens for r in cluster.reps),
        aborted_tokens=sum(r.aborted_tokens for r in cluster.reps),
        weight_loads=sum(r.updates for r in cluster.reps), first_version=list(cluster.first_version),
        continued_turns=sum(r.continued_turns for r in cluster.reps),
        update_recomputed_tokens=sum(r.update_recomputed_tokens for r in cluster.reps),
        tokens_by_staleness=tokens_by_staleness, push_wait_s=push_wait[0])
