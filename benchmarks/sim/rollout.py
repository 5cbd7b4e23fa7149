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
    (prefix-cache eviction is not modelled);
  * weight versions: `ReplicaCluster.publish(v)` pauses each replica the way vLLM's
    `pause_generation` does, then loads the weights, drops its prefix cache and resumes. Mode
    "wait": new requests queue, running turns finish (no turn mixes two versions); mode "abort":
    running turns are aborted and regenerated from their start with the new weights; mode "keep"
    (partial rollouts, vLLM's `pause_generation(mode="keep", clear_cache=True)`): running turns
    stop at the step boundary, the weights load at once, and each stopped turn continues on the
    new weights after re-prefilling its context and the tokens it had (`update_recomputed_tokens`).
`simulate` runs one synchronous rollout step; `sim.overlap` drives the
same cluster through many steps with rollout/training overlap.
Deterministic given the seed; every setting is an assumption documented in `ReplicaModel`.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Literal

from rstar2_cli.rollout.scheduler import LoadTracker, ReplicaLoad
from sim.baselines import Policy
from sim.workload import TrajectoryPlan


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


# Replica fleets the scripts simulate: (replicas, tensor parallel, replica model)
SIM_PRESETS = {
    # Qwen3-14B on 16 x 4 H100-80GB (see ReplicaModel's defaults)
    "h100-tp4": (16, 4, ReplicaModel()),
    # the paper's cluster: 64 MI300X (192 GB), one 14B replica per GPU: ~87 GB of KV at 0.6
    # utilisation = ~570K tokens at 160 KiB/token; one GPU decodes and prefills slower than four
    "mi300x-tp1": (64, 1, ReplicaModel(kv_capacity_tokens=570_000, step_base_s=0.012, step_per_seq_s=0.00012,
                                       prefill_tokens_per_s=15_000.0)),
}


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
    # waiting requests, heaps of (priority, rank, seq): preempted turns come first, newest first
    # (vLLM puts them back at the head of its queue); new requests FIFO within a priority
    resumed: list[tuple[int, int, _Seq]] = field(default_factory=list)
    fresh: list[tuple[int, int, _Seq]] = field(default_factory=list)
    cached: dict[int, int] = field(default_factory=dict)               # traj -> cached prefix length
    epoch: int = 0                            # invalidates planned step events
    weights: int = 0                          # policy version loaded
    loaded_at: float = 0.0                    # when it finished loading `weights`
    planned_steps: int = 0
    busy_s: float = 0.0
    paused_s: float = 0.0                     # loading weights
    preemptions: int = 0
    recomputed_tokens: int = 0
    aborted_tokens: int = 0
    update_recomputed_tokens: int = 0         # "keep": context re-prefilled by turns continued across an update
    continued_turns: int = 0                  # "keep": turns stopped by an update and continued
    updates: int = 0

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


UpdateMode = Literal["wait", "abort", "keep"]


def _footprint(plan: TrajectoryPlan) -> int:
    """KV tokens the trajectory's full context needs (plus the token being decoded)."""
    return plan.prompt_tokens + plan.generated_tokens + sum(t.tool_tokens for t in plan.turns) + 1


class ReplicaCluster:
    """N replicas and one event queue. `submit` starts a trajectory (its later turns follow its
    tool calls), `publish` announces a new weight version, `process_next` handles the earliest
    event and returns the trajectories it finished. Times are absolute seconds."""

    def __init__(self, num_replicas: int, model: ReplicaModel, policy: Policy, *, max_response_tokens: int = 8192,
                 tracker: LoadTracker | None = None, load_weights_s: float = 0.0, update_mode: UpdateMode = "wait"):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if update_mode not in ("wait", "abort", "keep"):
            raise ValueError(f"update_mode must be 'wait', 'abort' or 'keep', got {update_mode!r}")
        if load_weights_s < 0:
            raise ValueError(f"load_weights_s must be >= 0, got {load_weights_s}")
        self.model, self.policy, self.max_response_tokens = model, policy, max_response_tokens
        self.load_weights_s, self.update_mode = load_weights_s, update_mode
        self.reps = [_Replica(model) for _ in range(num_replicas)]
        self.tracker = tracker if tracker is not None else LoadTracker(num_replicas)
        self.events: list[tuple[float, int, str, int, int]] = []    # (time, seq no, kind, index, epoch)
        self._seq, self._rank, self._order = itertools.count(), itertools.count(1), itertools.count()
        self.plans: list[TrajectoryPlan] = []
        self.keys: list[str] = []
        self.priority: list[int] = []
        self.turn_of: list[int] = []
        self.ctx_of: list[int] = []
        self.first_version: list[int] = []      # weights that generated the first turn (-1: not yet)
        self.last_version: list[int] = []
        self.tokens_by_version: list[dict[int, int]] = []         # per trajectory: version -> tokens generated
        self.finished_at: list[float] = []
        self.reserved: dict[int, tuple[int, int]] = {}            # traj -> (replica, reserved tokens)
        self.target = 0                                            # newest published version

    def submit(self, plan: TrajectoryPlan, now: float, *, priority: int = 0, key: str | None = None) -> int:
        if _footprint(plan) > self.model.kv_capacity_tokens:
            raise ValueError(
                f"trajectory {plan.key} does not fit in kv_capacity_tokens={self.model.kv_capacity_tokens}"
            )
        i = len(self.plans)
        self.plans.append(plan)
        self.keys.append(plan.key if key is None else key)
        self.priority.append(priority)
        self.turn_of.append(0)
        self.ctx_of.append(plan.prompt_tokens)
        self.first_version.append(-1)
        self.last_version.append(-1)
        self.tokens_by_version.append({})
        self.finished_at.append(0.0)
        self._dispatch(i, now)
        return i

    def publish(self, version: int, now: float) -> None:
        """New weights are ready: every replica pauses (see `update_mode`), loads them, resumes."""
        if version <= self.target:
            raise ValueError(f"published version {version} is not newer than {self.target}")
        self.target = version
        for r, rep in enumerate(self.reps):
            self._catch_up(rep, now)
            if self.update_mode == "abort":
                self._abort_turns(rep)
            elif self.update_mode == "keep":
                self._keep_turns(rep)
            self._schedule(r)

    def next_time(self) -> float | None:
        return self.events[0][0] if self.events else None

    def run(self) -> None:
        while self.events:
            self.process_next()

    def process_next(self) -> list[int]:
        t, _, kind, idx, epoch = heapq.heappop(self.events)
        if kind == "arrive":
            self._dispatch(idx, t)
            return []
        rep = self.reps[idx]
        if epoch != rep.epoch:
            return []
        rep.advance(rep.planned_steps)
        rep.clock = max(rep.clock, t)
        done = []
        while rep.finish_heap and rep.finish_heap[0][0] <= rep.step:
            _, order = heapq.heappop(rep.finish_heap)
            if order not in rep.running:
                continue
            seq = rep.remove(order)
            i = seq.traj
            self._count_tokens(i, rep.weights, seq.remaining)
            turn = self.plans[i].turns[self.turn_of[i]]
            r, res = self.reserved.pop(i)
            self.tracker.end(r, res, turn.gen_tokens)
            self.ctx_of[i] = seq.ctx + seq.remaining
            rep.cached[i] = self.ctx_of[i]
            self.turn_of[i] += 1
            if self.turn_of[i] < len(self.plans[i].turns):
                self.ctx_of[i] += turn.tool_tokens
                heapq.heappush(self.events, (rep.clock + turn.tool_latency_s, next(self._seq), "arrive", i, 0))
            else:
                self.finished_at[i] = rep.clock
                done.append(i)
        self._schedule(idx)
        return done

    # ------------------------------------------------------------------ internals
    def _catch_up(self, rep: _Replica, now: float) -> None:
        """Account for the decode steps done since the replica's last event."""
        if rep.running:
            k = int((now - rep.clock) / self.model.step_time(len(rep.running)))
            rep.advance(max(0, min(k, rep.planned_steps - 1)))
        rep.clock = max(rep.clock, now)

    def _dispatch(self, i: int, now: float) -> None:
        plan, cap = self.plans[i], self.model.kv_capacity_tokens
        loads = [ReplicaLoad(engine_free=1.0 - rp.used() / cap, inflight_tokens=self.tracker.inflight_tokens[r],
                             capacity_tokens=cap) for r, rp in enumerate(self.reps)]
        r = self.policy.choose(loads, self.keys[i])
        turn = plan.turns[self.turn_of[i]]
        budget = max(1, self.max_response_tokens - (self.ctx_of[i] - plan.prompt_tokens))
        self.reserved[i] = (r, self.tracker.begin(r, self.ctx_of[i], budget))
        rep = self.reps[r]
        self._catch_up(rep, now)
        heapq.heappush(rep.fresh, (self.priority[i], next(self._rank), _Seq(i, self.ctx_of[i], turn.gen_tokens)))
        self._schedule(r)

    def _count_tokens(self, i: int, version: int, n: int) -> None:
        if n > 0:
            self.tokens_by_version[i][version] = self.tokens_by_version[i].get(version, 0) + n

    def _keep_turns(self, rep: _Replica) -> None:
        """vLLM pause(mode="keep", clear_cache=True): running turns stop where they are (their
        KV freed, their tokens kept), the weights load now, and the stopped turns wait at the head
        of the queue to re-prefill their context on the new weights and carry on."""
        for order in sorted(rep.running):
            seq = rep.remove(order)
            done = rep.step - seq.admit_step
            self._count_tokens(seq.traj, rep.weights, done)
            rep.continued_turns += 1
            rep.update_recomputed_tokens += seq.ctx + done
            heapq.heappush(rep.resumed, (self.priority[seq.traj], -next(self._rank),
                                         _Seq(seq.traj, seq.ctx + done, seq.remaining - done)))
        rep.clock += self.load_weights_s
        rep.paused_s += self.load_weights_s
        rep.weights, rep.updates, rep.loaded_at = self.target, rep.updates + 1, rep.clock
        rep.cached.clear()

    def _abort_turns(self, rep: _Replica) -> None:
        """vLLM pause(mode="abort"): running and preempted turns restart from their beginning."""
        partial = [(rep.running[o], rep.step - rep.running[o].admit_step) for o in sorted(rep.running)]
        for seq, _ in partial:
            rep.remove(seq.order)
        partial += [(s, 0) for _, _, s in sorted(rep.resumed)]
        rep.resumed.clear()
        for seq, done in partial:
            i = seq.traj
            gen = self.plans[i].turns[self.turn_of[i]].gen_tokens
            rep.aborted_tokens += gen - seq.remaining + done
            rep.cached.pop(i, None)
            heapq.heappush(rep.fresh, (self.priority[i], next(self._rank), _Seq(i, self.ctx_of[i], gen)))

    def _schedule(self, r: int) -> None:
        rep, model = self.reps[r], self.model
        cap = model.kv_capacity_tokens
        rep.epoch += 1
        # preempt newest until one more step fits
        while rep.running and rep.used() + len(rep.running) > cap:
            seq = rep.remove(max(rep.running))
            done = rep.step - seq.admit_step
            self._count_tokens(seq.traj, rep.weights, done)
            rep.preemptions += 1
            rep.recomputed_tokens += seq.ctx + done
            rep.cached.pop(seq.traj, None)
            heapq.heappush(rep.resumed, (self.priority[seq.traj], -next(self._rank),
                                         _Seq(seq.traj, seq.ctx + done, seq.remaining - done)))
        draining = rep.weights < self.target
        if draining and not rep.running and not rep.resumed:     # drained: load, drop old-weight KV
            rep.clock += self.load_weights_s
            rep.paused_s += self.load_weights_s
            rep.weights, rep.updates, draining = self.target, rep.updates + 1, False
            rep.loaded_at = rep.clock
            rep.cached.clear()
        prefill = 0
        while len(rep.running) < model.max_num_seqs:
            queue = rep.resumed or (None if draining else rep.fresh)    # paused: no new requests
            if not queue or rep.used() + queue[0][2].ctx + len(rep.running) + 1 > cap:
                break
            seq = heapq.heappop(queue)[2]
            if queue is rep.fresh:
                if self.turn_of[seq.traj] == 0:
                    self.first_version[seq.traj] = rep.weights
                self.last_version[seq.traj] = rep.weights
            prefill += seq.ctx - min(rep.cached.get(seq.traj, 0), seq.ctx)
            rep.admit(seq, next(self._order))
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
        k_full = (cap - rep.used()) // n
        k = max(1, min(k_finish, k_full))
        rep.planned_steps = k
        t = rep.clock + k * model.step_time(n)
        heapq.heappush(self.events, (t, next(self._seq), "step", r, rep.epoch))


def simulate(plans: list[TrajectoryPlan], num_replicas: int, model: ReplicaModel,
             policy: Policy, max_response_tokens: int = 8192, tracker: LoadTracker | None = None) -> SimResult:
    """Run every trajectory to completion; all first turns are submitted at t=0. `tracker` carries
    the running mean of turn lengths over from earlier steps, as the live scheduler does."""
    too_long = [p.key for p in plans if _footprint(p) > model.kv_capacity_tokens]
    if too_long:
        raise ValueError(f"trajectory {too_long[0]} does not fit in kv_capacity_tokens="
                         f"{model.kv_capacity_tokens} ({len(too_long)} such)")
    cluster = ReplicaCluster(num_replicas, model, policy, max_response_tokens=max_response_tokens, tracker=tracker)
    before = list(cluster.tracker.dispatched)
    for p in plans:
        cluster.submit(p, 0.0)
    cluster.run()
    reps = cluster.reps
    return SimResult(policy=policy.name, makespan_s=max(cluster.finished_at, default=0.0),
                     generated_tokens=sum(p.generated_tokens for p in plans),
                     preemptions=sum(r.preemptions for r in reps),
                     recomputed_tokens=sum(r.recomputed_tokens for r in reps),
                     replica_busy_s=[r.busy_s for r in reps],
                     dispatched=[a - b for a, b in zip(cluster.tracker.dispatched, before)])
