"""One RL run: the trainer and its step, the batch sources, the rollout side, resume, faults,
preemption, stages and the launch entry."""
