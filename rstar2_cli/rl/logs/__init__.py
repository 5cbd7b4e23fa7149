"""What a run leaves to read: metrics.jsonl and its mirrors, the curves, the rollout log, and the tool-
loop alarm."""
