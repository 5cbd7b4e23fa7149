"""The dispatch policies the simulator measures the load-balanced one against
(`rstar2_cli/rollout/scheduler.py`'s `LoadBalancedPolicy`, which rollouts use).

`RoundRobinPolicy` is the static baseline: the i-th distinct key -> replica i mod N, for life.
`ContiguousSplitPolicy` is the other common static split (verl-style): the batch is cut into N
contiguous chunks, so a replica gets whole prompts' groups.
`StickyLeastLoadedPolicy` is sticky routing with a load-aware first choice: a trajectory's first
turn goes to the least-loaded replica (the scheduler's load measure) and every later turn to that
replica, whatever its load (it holds the prefix). SkyRL pins a trajectory to `hash(id) mod N`; this
is the same stickiness with a load-aware placement of new trajectories.
"""
from __future__ import annotations

import itertools

from rstar2_cli.rollout.scheduler import LoadBalancedPolicy, ReplicaLoad


class RoundRobinPolicy:
    """Static split: the i-th distinct key goes to replica i mod N for its whole life."""
    name = "round_robin"

    def __init__(self) -> None:
        self.homes: dict[str, int] = {}
        self._anon = itertools.count()

    def choose(self, loads: list[ReplicaLoad], key: str | None = None) -> int:
        if not loads:
            raise ValueError("no replicas to dispatch to")
        if key is None:
            return next(self._anon) % len(loads)
        if key not in self.homes:
            self.homes[key] = len(self.homes) % len(loads)
        return self.homes[key]

    def reset(self) -> None:
        self.homes.clear()


class ContiguousSplitPolicy:
    """Static split into N contiguous chunks of a batch of `batch_size` trajectories: the i-th
    distinct key -> replica i * N // batch_size (keys beyond the batch wrap around)."""
    name = "contiguous_split"

    def __init__(self, batch_size: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.homes: dict[str, int] = {}

    def choose(self, loads: list[ReplicaLoad], key: str | None = None) -> int:
        if not loads:
            raise ValueError("no replicas to dispatch to")
        k = key if key is not None else f"_anon{len(self.homes)}"
        if k not in self.homes:
            self.homes[k] = (len(self.homes) % self.batch_size) * len(loads) // self.batch_size
        return self.homes[k]

    def reset(self) -> None:
        self.homes.clear()


class StickyLeastLoadedPolicy:
    """A new key goes to the least-loaded replica; every later request with that key goes to the
    same replica, however loaded (its prefix is cached there). Requests without a key always go
    to the least-loaded replica."""
    name = "sticky_least_loaded"

    def __init__(self) -> None:
        self.homes: dict[str, int] = {}

    def choose(self, loads: list[ReplicaLoad], key: str | None = None) -> int:
        if not loads:
            raise ValueError("no replicas to dispatch to")
        home = self.homes.get(key) if key is not None else None
        if home is not None and home < len(loads):
            return home
        best = LoadBalancedPolicy.best(loads)
        if key is not None:
            self.homes[key] = best
        return best

    def reset(self) -> None:
        self.homes.clear()


Policy = LoadBalancedPolicy | RoundRobinPolicy | ContiguousSplitPolicy | StickyLeastLoadedPolicy
