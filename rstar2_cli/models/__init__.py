"""The policy model's pieces shared by SFT and RL: `tiny.build_tiny_model` makes the laptop-sized
Qwen3 used by tests and the quickstart; `attention` picks the attention kernel and the micro-batch
layout it needs. Nothing is imported here, so that the trainer's `attention` import does not pull
the tiny model's tokenizer and protocol code onto a bare GPU node (benchmarks/gpu/gpu_smoke.py)."""
