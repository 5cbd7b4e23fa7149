"""A rollout host's half of the step: which trajectories train (exclusion), RoC down to G, advantages,
and the host's summary."""
