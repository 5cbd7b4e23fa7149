"""Simulators of the rollout side at cluster scale, for benchmarks and tests only.

`sim.workload`: the seeded multi-turn trajectories they replay. `sim.rollout`: one synchronous
rollout step on N vLLM-like replicas (discrete events, the same dispatch policies as
`rstar2_cli.rollout.scheduler`). `sim.overlap`: many steps of
rollout/training overlap with bounded staleness on the same replicas (docs/async-rl.md).

`bench_async_sim.py`: the script that runs `sim.overlap`'s sections (docs/async-rl.md).

Imported as the top-level package `sim`: the scripts that use it (benchmarks/timing/bench_scheduler.py,
benchmarks/sim/bench_async_sim.py) put `benchmarks/` on sys.path, and pytest adds it through `pythonpath` in
pyproject.toml.
"""
