"""What a process needs from the machine it runs on, below every other floor: TCP ports for
rendezvous stores (`ports`) and which GPUs a spawned process sees (`gpu_visibility`). Both the
launch planner and the rollout engines use them, so they live under both and import neither."""
