"""GPU check of the weight sync through vLLM's weight-transfer API: two RL steps per backend.

It has not been run (written without a GPU at hand); run it on the first GPU node and put the
figures in docs/scale-out.md. Needs one GPU (two for nccl), vLLM and this source tree; no network.
`--help` and the CUDA check work on CPU; everything else needs CUDA.

    python benchmarks/gpu/gpu_rl_smoke.py                          # ipc + chunked (+ nccl with 2 GPUs)
    python benchmarks/gpu/gpu_rl_smoke.py --backends ipc --model 0.25b

The default model (`14b-embed`) is a random 2-layer Qwen3 with Qwen3-14B's widths and untied
embeddings, so the push carries two 151936 x 5120 bf16 tensors (1.45 GiB each, more than vLLM's
1 GiB default packed buffer): the sync must size its IPC buffer from the model. `--model 0.25b`
etc. take bench_load_memory.py's smaller tied shapes instead.

For each backend the model (a bf16 checkpoint) gets a vLLM engine and the trainer's policy on the
same GPU (colocated: the trainer's own `WeightPusher(colocated=True)` cycle, sleep level 2 during
the update, then wake weights, push, wake KV cache; nccl puts the engine on GPU 1). Each step:
greedy rollouts, a policy update on them (large LR so the policy moves), the sync, greedy rollouts
again. Checks, per step: the greedy output changed after the sync; the engine's greedy tokens are
the trainer's argmax at >= --min-agree of the positions (bf16 near-ties allow a few flips) and its
logprobs are within --max-logprob-diff of the trainer's (a parameter the push missed would be
garbage after a level-2 sleep). Results as JSON and a table; exit status 1 if a check fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "timing"))     # bench_load_memory's shapes
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from bench_load_memory import COMMON, SHAPES  # noqa: E402
from gpu_shapes_check import qwen3_config  # noqa: E402
from harness import Stopwatch, write_json  # noqa: E402
from rstar2_cli.config import EngineConfig, LossConfig, ModelConfig, OptimConfig  # noqa: E402
from rstar2_cli.rl.update.loss import group_advantages  # noqa: E402
from rstar2_cli.rl.update.policy import PolicyTrainer  # noqa: E402
from rstar2_cli.rollout.engines import GenRequest, VLLMEngine  # noqa: E402
from rstar2_cli.rollout.trajectory import Trajectory  # noqa: E402
from rstar2_cli.rollout.weight_sync.pusher import WeightPusher  # noqa: E402

EMBED_14B = "14b-embed"


def smoke_config(model: str):
    """The smoke model's config: Qwen3-14B's widths on 2 layers (`EMBED_14B`), or one of
    bench_load_memory.py's shapes."""
    from transformers import Qwen3Config

    if model == EMBED_14B:
        config = qwen3_config("qwen3-14b")
        config.num_hidden_layers = 2
        config.layer_types = config.layer_types[:2]
        config.max_position_embeddings = 4096
        return config
    return Qwen3Config(**COMMON, **SHAPES[model])


def build_smoke_checkpoint(model: str, work: Path) -> tuple[Path, int]:
    """A random bf16 checkpoint of `smoke_config(model)` in `work` (reused if present); (dir, parameters)."""
    import torch
    from transformers import Qwen3ForCausalLM

    path, config = work / f"qwen3_{model}", smoke_config(model)
    if not (path / "model.safetensors").is_file() and not (path / "model.safetensors.index.json").is_file():
        torch.manual_seed(0)
        Qwen3ForCausalLM._from_config(config, dtype=torch.bfloat16).save_pretrained(path)
    with torch.device("meta"):
        return path, sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())


def greedy(engine, prompts: list[list[int]], max_tokens: int) -> list:
    return engine.generate_batch([GenRequest(prompt_ids=p, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
                                  for p in prompts])


def trainer_agreement(policy, prompts, results) -> tuple[float, float]:
    """(share of engine tokens that are the trainer's argmax, mean |engine - trainer| logprob)."""
    import torch

    agree = total = 0
    diff = 0.0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for p, r in zip(prompts, results):
            ids = torch.tensor([p + r.token_ids], device=policy.device)
            logits = policy.model(input_ids=ids, use_cache=False).logits[0, len(p) - 1:-1].float()
            target = torch.tensor(r.token_ids, device=policy.device)
            agree += int((logits.argmax(-1) == target).sum())
            logp = torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]
            diff += float((logp - torch.tensor(r.logprobs, device=policy.device)).abs().sum())
            total += len(r.token_ids)
    return agree / total, diff / total


def run_backend(backend: str, model_dir: Path, args) -> dict:
    import torch

    colocate = backend != "nccl"
    cfg = EngineConfig(colocate=colocate, gpu_memory_utilization=args.gpu_memory_utilization,
                       weight_transfer=backend, enforce_eager=True)
    engine = VLLMEngine.from_config(str(model_dir), cfg, max_model_len=1024, weight_transfer=backend,
                                    gpu_ids=None if colocate else [1])
    policy = PolicyTrainer(ModelConfig(path=str(model_dir)), OptimConfig(lr=args.lr, warmup_steps=0), LossConfig(),
                           micro_batch_tokens=4096)
    pusher = WeightPusher(backend, model=policy.model, engines=[engine], is_host=True, engine_dtype=torch.bfloat16,
                          rank=0, colocated=colocate)     # GPU only from here on
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 151936, (16,), generator=gen).tolist() for _ in range(args.prompts)]
    steps = []
    before = greedy(engine, prompts, args.max_tokens)
    for step in range(2):
        trajs = [Trajectory(prompt_id=f"p{i // 2}", sample_index=i % 2, prompt_ids=p, response_ids=r.token_ids,
                            loss_mask=[1] * len(r.token_ids), logprobs=r.logprobs, reward=float(i % 2))
                 for i, (p, r) in enumerate(zip(prompts, before))]
        adv = []
        for g in range(0, len(trajs), 2):
            adv += group_advantages([t.reward for t in trajs[g:g + 2]])
        pusher.sleep_engines()                 # colocated: level 2, weights and KV cache discarded
        update = policy.update(trajs, adv)
        torch.cuda.synchronize()
        with Stopwatch() as sync:
            pusher.push(policy)                # colocated: wake weights, push, wake KV cache
            torch.cuda.synchronize()
        sync_s = sync.seconds
        after = greedy(engine, prompts, args.max_tokens)
        agree, logprob_diff = trainer_agreement(policy, prompts, after)
        changed = sum(a.token_ids != b.token_ids for a, b in zip(after, before))
        steps.append({"step": step + 1, "loss": update["loss"], "sync_s": round(sync_s, 3),
                      "outputs_changed": changed, "argmax_agree": round(agree, 4),
                      "logprob_abs_diff": round(logprob_diff, 4),
                      "ok": changed > 0 and agree >= args.min_agree and logprob_diff <= args.max_logprob_diff})
        before = after
    pusher.close()
    engine.shutdown()
    del policy
    torch.cuda.empty_cache()
    buffer = getattr(pusher.transport, "buffer_bytes", None)
    return {"backend": backend, "packed_buffer_bytes": buffer, "steps": steps, "ok": all(s["ok"] for s in steps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", default=["ipc", "nccl", "chunked"], choices=["ipc", "nccl", "chunked"])
    ap.add_argument("--model", default=EMBED_14B, choices=[EMBED_14B, "0.25b", "0.5b", "1b"],
                    help=f"{EMBED_14B}: 2 layers of Qwen3-14B's widths (its 1.45 GiB embedding and lm_head); "
                         "else a bench_load_memory.py shape")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--min-agree", type=float, default=0.9)
    ap.add_argument("--max-logprob-diff", type=float, default=0.1)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rstar2_gpu_rl_smoke")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_rl_smoke.json"))
    args = ap.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table

    if not torch.cuda.is_available():
        print("error: gpu_rl_smoke needs a CUDA GPU (vLLM's ipc/nccl weight transfer is GPU only)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir, params = build_smoke_checkpoint(args.model, args.work)
    results = []
    for backend in args.backends:
        if backend == "nccl" and torch.cuda.device_count() < 2:
            results.append({"backend": backend, "skipped": "needs 2 GPUs (NCCL cannot put two ranks on one GPU)"})
            continue
        results.append(run_backend(backend, model_dir, args))
    table = Table(title=f"gpu rl smoke: {args.model}, {params / 1e9:.2f}B Qwen3, {torch.cuda.get_device_name()}")
    for col in ("backend", "step", "sync s", "outputs changed", "argmax agree", "|dlogp|", "ok"):
        table.add_column(col)
    for r in results:
        if "skipped" in r:
            table.add_row(r["backend"], "-", "skipped: " + r["skipped"], "", "", "", "")
        for s in r.get("steps", []):
            table.add_row(r["backend"], str(s["step"]), str(s["sync_s"]), f"{s['outputs_changed']}/{args.prompts}",
                          str(s["argmax_agree"]), str(s["logprob_abs_diff"]), "ok" if s["ok"] else "FAIL")
    Console().print(table)
    write_json(args.out, {"model": args.model, "params": params, "device": torch.cuda.get_device_name(),
                          "results": results}, indent=2)
    return 0 if all(r.get("ok", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
