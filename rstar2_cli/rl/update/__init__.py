"""The policy update: the model, AdamW, the loss, log-probs, packing, and checkpoints of it."""
