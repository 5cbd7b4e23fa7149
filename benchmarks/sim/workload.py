"""The rollout workload the simulators replay: seeded multi-turn trajectories whose turn counts,
lengths and tool latencies are skewed as in agentic RL (a fraction of long trajectories,
concentrated on hard prompts)."""
from __future__ import annotations

import random
from dataclasses import dataclass


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
