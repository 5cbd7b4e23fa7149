"""The quickstart's toy task: integer arithmetic that a tiny model cannot do in its head.

Products of a 3-digit and a 2-digit number, plus a 2-digit offset, e.g. "Compute 482*37+95."
A 2-layer model cannot multiply, but it can learn to copy the operands into
`print(482*37+95)` and copy the tool's output into `\\boxed{}`. So accuracy measures tool use,
which is exactly what agentic RL should improve. The operands are kept short because every digit
is a token the model must learn to copy, and CPU SFT time is the quickstart's budget; the problem
writes the expression exactly as the code does, so the copy is a plain span copy (what induction
heads learn first), not a reformatting.

Problems are generated deterministically from a seed; the held-out set is drawn from the same
distribution with a disjoint id space and de-duplicated against the training set by text.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class ToyProblem:
    id: str
    problem: str
    answer: str
    a: int
    b: int
    c: int

    @property
    def expression(self) -> str:
        return f"{self.a}*{self.b}+{self.c}"

    def to_row(self) -> dict:
        return {"id": self.id, "problem": self.problem, "answer": self.answer}


def _one(rng: random.Random, pid: str) -> ToyProblem:
    a = rng.randint(300, 999)       # a*b+c always has 5 digits: fixed offsets make copying easy
    b = rng.randint(40, 99)
    c = rng.randint(10, 99)
    text = f"Compute {a}*{b}+{c}."
    return ToyProblem(pid, text, str(a * b + c), a, b, c)


def make_toy_split(seed: int, n_train: int, n_heldout: int) -> tuple[list[ToyProblem], list[ToyProblem]]:
    """(train, heldout), disjoint by problem text, reproducible from `seed`."""
    rng = random.Random(f"rstar2-toy-{seed}")
    seen: set[str] = set()
    train: list[ToyProblem] = []
    heldout: list[ToyProblem] = []
    while len(train) < n_train:
        p = _one(rng, f"toy-{seed}-train-{len(train)}")
        if p.problem not in seen:
            seen.add(p.problem)
            train.append(p)
    while len(heldout) < n_heldout:
        p = _one(rng, f"toy-{seed}-heldout-{len(heldout)}")
        if p.problem not in seen:
            seen.add(p.problem)
            heldout.append(p)
    return train, heldout
