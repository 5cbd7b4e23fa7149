"""Discrete-event simulator of multi-turn rollouts on N vLLM-like replicas.

Why: the scheduler's benefit shows at cluster scale (16 replicas x TP4, 512 prompts x 32
rollouts) that a laptop cannot run. The simulator replays a seeded workload (trajectories with
known turn lengths and tool latencies) through the SAME dispatch policies as
`rstar2_cli.rollout.scheduler`, on replicas that model what matters for makespan:
  * continuous batching: a decode step advances every running sequence by one token and takes
    `step_base_s + step_per_seq_s * batch` seconds;
  * a KV cache of `kv_capacity_tokens`: a request is admitted only if its context fits; when
    growing sequences overflow it, the most recently admitted one is preempted and later
    recomputed (vLLM V1's policy);
  * prefill at `prefill_tokens_per_s`, skipping a trajectory's prefix still cached on that replica
    (prefix-cache eviction is not modelled).
Deterministic given the seed; every setting is an assumption documented in `ReplicaModel`.
"""
from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from rstar2_cli.rollout.scheduler import (ContiguousSplitPolicy, LoadBalancedPolicy, LoadTracker, Policy,
                                          ReplicaLoad, RoundRobinPolicy)


@dataclass(frozen=True)
class ReplicaModel:
    """One TP group. Defaults: Qwen3-14B bf16 on 4 x H100-80GB with ~0.6 memory for vLLM
    (KV = 160 KiB/token -> ~1M tokens), decode ~15 ms/step at batch 1 growing with the batch."""
    kv_capacity_tokens: int = 1_000_000
    max_num_seqs: int = 256
    step_base_s: float = 0.015
    step_per_seq_s: float = 0.0001
    prefill_tokens_per_s: float = 40_000.0

    def step_time(self, batch: int) -> float:
        return self.step_base_s + self.step_per_seq_s * batch


@dataclass(frozen=True)
class WorkloadSpec:
    """Skewed multi-turn workload: a `long_fraction` of trajectories take many long turns."""
    num_prompts: int = 512
    rollouts_per_prompt: int = 32
    prompt_tokens: tuple[int, int] = (100, 400)
    long_fraction: float = 0.2
    prompt_correlation: float = 0.8   # 0: long rollouts iid; 1: a prompt's rollouts are all long or all short
    long_turns: tuple[int, int] = (6, 10)
    long_turn_tokens: tuple[int, int] = (400, 1200)
    short_turns: tuple[int, int] = (1, 2)
    short_turn_tokens: tuple[int, int] = (150, 600)
    tool_latency_s: tuple[float, float] = (0.2, 2.0)
    tool_response_tokens: tuple[int, int] = (20, 200)
    max_response_tokens: int = 8192

    def __post_init__(self) -> None:
        for name in ("long_fraction", "prompt_correlation"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"WorkloadSpec.{name}: must be in [0, 1], got {getattr(self, name)}")
        for name in ("prompt_tokens", "long_turns", "long_turn_tokens", "short_turns",
                     "short_turn_tokens", "tool_latency_s", "tool_response_tokens"):
            lo, hi = getattr(self, name)
            if lo > hi or lo < 0:
                raise ValueError(f"WorkloadSpec.{name}: expected 0 <= lo <= hi, got {(lo, hi)}")


@dataclass
class Turn:
    gen_tokens: int
    tool_latency_s: float = 0.0       # after this turn (0 for the last)
    tool_tokens: int = 0              # tool-response tokens appended after this turn


@dataclass
class TrajectoryPlan:
    key: str
    prompt_tokens: int
    turns: list[Turn]
    long: bool = False

    @property
    def generated_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns)


def make_workload(spec: WorkloadSpec, seed: int = 0) -> list[TrajectoryPlan]:
    """Trajectories in prompt-major order (as the agent loop submits them). Exactly
    round(long_fraction * n) of them are long; with `prompt_correlation` > 0 they concentrate on
    "hard" prompts (weighted sampling without replacement), as hard problems do in RL."""
    rng = random.Random(seed)
    n = spec.num_prompts * spec.rollouts_per_prompt
    prompts = [rng.randint(*spec.prompt_tokens) for _ in range(spec.num_prompts)]
    hard = [rng.random() < spec.long_fraction for _ in range(spec.num_prompts)]
    c = spec.prompt_correlation
    weight = [c * hard[i // spec.rollouts_per_prompt] + (1.0 - c) * spec.long_fraction + 1e-9 for i in range(n)]
    keys = sorted(range(n), key=lambda i: rng.random() ** (1.0 / weight[i]), reverse=True)
    long_set = set(keys[:round(spec.long_fraction * n)])
    plans = []
    for i in range(n):
        long = i in long_set
        n_turns = rng.randint(*(spec.long_turns if long else spec.short_turns))
        lo, hi = spec.long_turn_tokens if long else spec.short_turn_tokens
        turns, budget = [], spec.max_response_tokens
        for j in range(n_turns):
            gen = min(rng.randint(lo, hi), budget)
            budget -= gen
            last = j == n_turns - 1 or budget <= 0
            tool = 0 if last else min(rng.randint(*spec.tool_response_tokens), budget)
            budget -= tool
            turns.append(Turn(gen, 0.0 if last else rng.uniform(*spec.tool_latency_s), tool))
            if last or budget <= 0:
                break
        p, s_idx = divmod(i, spec.rollouts_per_prompt)
        plans.append(TrajectoryPlan(f"p{p}-s{s_idx}", prompts[p], turns, long))
    return plans


@dataclass
class _Seq:
    traj: int
    ctx: int                  # context tokens when (re)admitted
    remaining: int            # tokens still to generate in this turn
    admit_step: int = 0
    order: int = 0


@dataclass
class _Replica:
    model: ReplicaModel
    step: int = 0
    clock: float = 0.0
    base: int = 0                             # used tokens = base + len(running) * step
    running: dict[int, _Seq] = field(default_factory=dict)
    finish_heap: list[tuple[int, int]] = field(default_factory=list)   # (finish step, order)
    waiting: deque = field(default_factory=deque)
    cached: dict[int, int] = field(default_factory=dict)               # traj -> cached prefix length
    version: int = 0
    planned_steps: int = 0
    busy_s: float = 0.0
    preemptions: int = 0
    recomputed_tokens: int = 0

    def used(self) -> int:
        return self.base + len(self.running) * self.step

    def advance(self, steps: int) -> None:
        dt = steps * self.model.step_time(len(self.running))
        self.step += steps
        self.clock += dt
        self.busy_s += dt

    def admit(self, seq: _Seq, order: int) -> None:
        seq.admit_step, seq.order = self.step, order
        self.running[order] = seq
        self.base += seq.ctx - self.step
        heapq.heappush(self.finish_heap, (self.step + seq.remaining, order))

    def remove(self, order: int) -> _Seq:
        seq = self.running.pop(order)
        self.base -= seq.ctx - seq.admit_step
        return seq


@dataclass
class SimResult:
    policy: str
    makespan_s: float
    generated_tokens: int
    preemptions: int
    recomputed_tokens: int
    replica_busy_s: list[float]
    dispatched: list[int]


def simulate(plans: list[TrajectoryPlan], num_replicas: int, model: ReplicaModel,
             policy: Policy, max_response_tokens: int = 8192) -> SimResult:
    """Run every trajectory to completion; all first turns are submitted at t=0."""
    too_long = [p.key for p in plans
                if p.prompt_tokens + p.generated_tokens + sum(t.tool_tokens for t in p.turns) + 1
                > model.kv_capacity_tokens]
    if too_long:
        raise ValueError(f"trajectory {too_long[0]} does not fit in kv_capacity_tokens="
                         f"{model.kv_capacity_tokens} ({len(too_long)} such)")
    reps = [_Replica(model) for _ in range(num_replicas)]
    tracker = LoadTracker(num_replicas)
    events: list[tuple[float, int, str, int, int]] = []    # (time, seq no, kind, index, version)
    counter = iter(range(1 << 62))
    turn_of = [0] * len(plans)
    ctx_of = [p.prompt_tokens for p in plans]
    reserved: dict[int, tuple[int, int]] = {}               # traj -> (replica, reserved tokens)
    finished_at = [0.0] * len(plans)
    order_no = iter(range(1 << 62))

    def schedule(r: int) -> None:
        rep = reps[r]
        rep.version += 1
        # preempt newest until one more step fits
        while rep.running and rep.used() + len(rep.running) > model.kv_capacity_tokens:
            seq = rep.remove(max(rep.running))
            done = rep.step - seq.admit_step
            rep.preemptions += 1
            rep.recomputed_tokens += seq.ctx + done
            rep.cached.pop(seq.traj, None)
            rep.waiting.appendleft(_Seq(seq.traj, seq.ctx + done, seq.remaining - done))
        prefill = 0
        while (rep.waiting and len(rep.running) < model.max_num_seqs
               and rep.used() + rep.waiting[0].ctx + len(rep.running) + 1 <= model.kv_capacity_tokens):
            seq = rep.waiting.popleft()
            prefill += seq.ctx - min(rep.cached.get(seq.traj, 0), seq.ctx)
            rep.admit(seq, next(order_no))
        if prefill:
            dt = prefill / model.prefill_tokens_per_s
            rep.clock += dt
            rep.busy_s += dt
        if not rep.running:
            rep.planned_steps = 0
            return
        while rep.finish_heap and rep.finish_heap[0][1] not in rep.running:
            heapq.heappop(rep.finish_heap)             # lazily drop preempted entries
        k_finish = rep.finish_heap[0][0] - rep.step
        n = len(rep.running)
        k_full = (model.kv_capacity_tokens - rep.used()) // n
        k = max(1, min(k_finish, k_full))
        rep.planned_steps = k
        t = rep.clock + k * model.step_time(n)
        heapq.heappush(events, (t, next(counter), "step", r, rep.version))

    def dispatch(i: int, now: float) -> None:
        plan = plans[i]
        loads = [ReplicaLoad(engine_free=1.0 - rp.used() / model.kv_capacity_tokens,
                             inflight_tokens=tracker.inflight_tokens[r], capacity_tokens=model.kv_capacity_tokens)
                 for r, rp in enumerate(reps)]
        r = policy.choose(loads, plan.key)
        turn = plan.turns[turn_of[i]]
        budget = max(1, max_response_tokens - (ctx_of[i] - plan.prompt_tokens))
        reserved[i] = (r, tracker.begin(r, ctx_of[i], budget))
        rep = reps[r]
        if rep.running:       # catch up on the steps done since the last event, then re-plan
            k = int((now - rep.clock) / model.step_time(len(rep.running)))
            rep.advance(max(0, min(k, rep.planned_steps - 1)))
        rep.clock = max(rep.clock, now)
        rep.waiting.append(_Seq(i, ctx_of[i], turn.gen_tokens))
        schedule(r)

    for i in range(len(plans)):
        dispatch(i, 0.0)
    while events:
        t, _, kind, idx, version = heapq.heappop(events)
        if kind == "arrive":
            dispatch(idx, t)
            continue
        rep = reps[idx]
        if version != rep.version:
            continue
        rep.advance(rep.planned_steps)
        rep.clock = max(rep.clock, t)
        while rep.finish_heap and rep.finish_heap[0][0] <= rep.step:
            _, order = heapq.heappop(rep.finish_heap)
            if order not in rep.running:
                continue
            seq = rep.remove(order)
            i = seq.traj
            turn = plans[i].turns[turn_of[i]]
            r, res = reserved.pop(i)
            tracker.end(r, res, turn.gen_tokens)
            ctx_of[i] = seq.ctx + seq.remaining
            rep.cached[i] = ctx_of[i]
            turn_of[i] += 1
            if turn_of[i] < len(plans[i].turns):
                ctx_of[i] += turn.tool_tokens
                heapq.heappush(events, (rep.clock + turn.tool_latency_s, next(counter), "arrive", i, 0))
            else:
                finished_at[i] = rep.clock
        schedule(idx)
    name = {LoadBalancedPolicy: "load_balanced", RoundRobinPolicy: "round_robin",
            ContiguousSplitPolicy: "contiguous_split"}[type(policy)]
    return SimResult(policy=name, makespan_s=max(finished_at, default=0.0),
                     generated_tokens=sum(p.generated_tokens for p in plans),
                     preemptions=sum(r.preemptions for r in reps),
                     recomputed_tokens=sum(r.recomputed_tokens for r in reps),
                     replica_busy_s=[r.busy_s for r in reps], dispatched=list(tracker.dispatched))
