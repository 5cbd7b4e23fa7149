"""Simulators of the rollout side at cluster scale, for benchmarks and tests only.

`sim.workload`: the seeded multi-turn trajectories they replay. `sim.rollout`: one synchronous
rollout step on N vLLM-like replicas (discrete events, the same load-balanced dispatch policy as
`rstar2_cli.rollout.scheduler`, or a static baseline from `sim.baselines`). `sim.overlap`: many steps of
rollout/training overlap with bounded staleness on the same replicas (docs/async-rl.md).

`bench_async_sim.py`: the script that runs `sim.overlap`'s sections (docs/async-rl.md).

Imported as the top-level package `sim`: the script that uses it (benchmarks/sim/bench_async_sim.py) puts
`benchmarks/` on sys.path, and pytest adds it through `pythonpath` in
pyproject.toml.
"""
