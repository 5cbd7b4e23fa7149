"""Load-balanced rollout scheduler across vLLM replicas (rStar2-Agent §3.2).

Why: multi-turn rollouts are badly skewed — a few trajectories take many long turns, most end
after one or two. Splitting the batch statically across replicas (trajectory i -> replica i mod N)
lets one replica's KV cache overflow (requests queue or get preempted and recomputed) while others
sit idle. Here every generation request — each turn of each trajectory — is dispatched the moment
it arrives to the replica with the most free KV capacity at that moment.

Dispatch rule (`LoadBalancedPolicy`):
  * A replica's load is `max(1 - engine.kv_free_fraction(), inflight_tokens / capacity)`: the
    engine figure is exact but refreshed once per engine step; the in-flight term (prompt +
    expected new tokens of requests sent and not yet answered, queued ones included) keeps
    decisions sensible for a burst dispatched between two refreshes, and keeps growing past 1.0
    when a replica is oversubscribed, so saturated replicas still compare. Expected new tokens =
    running mean of generated lengths seen so far (`max_tokens` before the first answer).
  * The first turn of a trajectory (`key`) goes to the least-loaded replica (ties: fewer
    in-flight tokens, then lower index).
  * A later turn stays on the replica of its previous turn (its prefix is cached there) unless
    (a) that replica's load exceeds the least-loaded one's by more than `margin` (default 0.25 of
    a KV cache), or (b) it is nearly full (load > 1 - `min_free`, default 0.1) while the least
    loaded one is not. Then the turn moves, and its new replica becomes its home. When every
    replica is full, nothing moves: re-prefilling elsewhere would only add work.
The policy is pure (no asyncio), so the discrete-event simulator (`benchmarks/sim/`) runs exactly
this code, beside the static baselines it is measured against (`benchmarks/sim/baselines.py`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from rstar2_cli.rollout.generation import Engine, GenRequest, GenResult


class ReplicaLoad(NamedTuple):
    """What a policy sees of one replica at dispatch time (a tuple: the simulator builds one per
    replica per request, so it must be cheap)."""
    engine_free: float          # engine-reported free KV fraction (0..1)
    inflight_tokens: int        # tokens of requests sent to it and not answered yet
    capacity_tokens: int        # KV capacity in tokens (0 = unknown)

    @property
    def load(self) -> float:
        """Used fraction of the KV cache, > 1.0 when more work is queued than fits."""
        used = 1.0 - self.engine_free
        if self.capacity_tokens > 0:
            used = max(used, self.inflight_tokens / self.capacity_tokens)
        return used

    @property
    def free(self) -> float:
        return max(0.0, 1.0 - self.load)


class LoadBalancedPolicy:
    name = "load_balanced"

    def __init__(self, min_free: float = 0.1, margin: float = 0.25):
        if not 0.0 <= min_free < 1.0:
            raise ValueError(f"min_free must be in [0, 1), got {min_free}")
        if not 0.0 <= margin <= 1.0:
            raise ValueError(f"margin must be in [0, 1], got {margin}")
        self.min_free, self.margin = min_free, margin
        self.homes: dict[str, int] = {}
        self.sticky_hits = 0
        self.moves = 0

    @staticmethod
    def best(loads: list[ReplicaLoad]) -> int:
        keys = [(r.load, r.inflight_tokens, i) for i, r in enumerate(loads)]
        return min(keys)[2]

    def choose(self, loads: list[ReplicaLoad], key: str | None = None) -> int:
        if not loads:
            raise ValueError("no replicas to dispatch to")
        best = self.best(loads)
        home = self.homes.get(key) if key is not None else None
        if home is not None and home < len(loads):
            h, b = loads[home].load, loads[best].load
            full = 1.0 - self.min_free
            if home == best or (h - b <= self.margin and not (h > full >= b)):
                self.sticky_hits += 1
                return home
            self.moves += 1
        if key is not None:
            self.homes[key] = best
        return best

    def reset(self) -> None:
        """Forget trajectory homes (call between rollout steps: new weights, new trajectories)."""
        self.homes.clear()


class LoadTracker:
    """Per-replica in-flight token accounting and the running mean of generated lengths."""

    def __init__(self, num_replicas: int):
        self.inflight_tokens = [0] * num_replicas
        self.inflight_requests = [0] * num_replicas
        self.dispatched = [0] * num_replicas
        self._gen_total = 0
        self._gen_count = 0

    def expected_new_tokens(self, max_tokens: int) -> int:
        if self._gen_count == 0:
            return max_tokens
        return min(max_tokens, round(self._gen_total / self._gen_count))

    def begin(self, replica: int, prompt_len: int, max_tokens: int) -> int:
        tokens = prompt_len + self.expected_new_tokens(max_tokens)
        self.inflight_tokens[replica] += tokens
        self.inflight_requests[replica] += 1
        self.dispatched[replica] += 1
        return tokens

    def end(self, replica: int, reserved: int, generated: int | None) -> None:
        self.inflight_tokens[replica] -= reserved
        self.inflight_requests[replica] -= 1
        if generated is not None:
            self._gen_total += generated
            self._gen_count += 1


class LoadBalancedScheduler:
    """Async front over N engines: `generate(req, key)` sends each request to the replica
    `LoadBalancedPolicy` picks (module docstring)."""

    def __init__(self, engines: list["Engine"], *, min_free: float = 0.1, margin: float = 0.25):
        if not engines:
            raise ValueError("a scheduler needs at least one engine")
        self.engines = list(engines)
        self.policy = LoadBalancedPolicy(min_free=min_free, margin=margin)
        self.tracker = LoadTracker(len(self.engines))

    def loads(self) -> list[ReplicaLoad]:
        return [ReplicaLoad(engine_free=e.kv_free_fraction(), inflight_tokens=self.tracker.inflight_tokens[i],
                            capacity_tokens=int(getattr(e, "kv_capacity_tokens", 0) or 0))
                for i, e in enumerate(self.engines)]

    async def generate(self, req: "GenRequest", key: str | None = None) -> "GenResult":
        replica = self.policy.choose(self.loads(), key)
        reserved = self.tracker.begin(replica, len(req.prompt_ids), req.max_tokens)
        generated = None
        try:
            result = await self.engines[replica].generate(req)
            generated = len(result.token_ids)
            return result
        finally:
            self.tracker.end(replica, reserved, generated)

    def reset(self) -> None:
        self.policy.reset()

    def stats(self) -> dict[str, object]:
        return {"dispatched": list(self.tracker.dispatched), "sticky_hits": self.policy.sticky_hits,
                "moves": self.policy.moves}
