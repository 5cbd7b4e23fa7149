"""Where an RL run's processes are and how they talk: torch.distributed and its liveness, the rollout
hosts, the trainer's CPU threads, and the step's exchange of trajectories."""
