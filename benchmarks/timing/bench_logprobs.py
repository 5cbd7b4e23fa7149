"""Peak memory and time of the policy's log-prob pass (forward + backward): the chunked head
(rstar2_cli/rl/update/logprobs.py) against the full-logits path it replaces, in one run.

Each case scores `tokens` positions with the Qwen3 vocabulary (151,936) from random fp32 hidden
states [tokens, H] through an LM-head weight [V, H], evaluates the Clip-Higher loss
(rl/loss.clip_higher_loss, random old log-probs and advantages) and backpropagates to the hidden
states and the weight:

  full     `F.linear` logits [tokens, V] (as `lm_head`), fp32, log-softmax, gather, and the
           logged entropy from a second log-softmax (`full_logits_logprobs`, the reference the
           tests compare against);
  chunked  `token_logprobs_with_loss`, `--chunk` tokens at a time, gradients formed per chunk.

Memory: every case runs in a fresh subprocess. After set-up and a warm-up pass at 256 tokens the
kernel's resident-set high-water mark is reset (`/proc/self/clear_refs` = 5); the case's peak is
VmHWM after the pass minus VmRSS at the reset, i.e. every page the pass touched, whoever
allocated it. tracemalloc sees none of torch's memory and torch keeps no CPU peak counter;
sampling RSS (psutil) misses short peaks, the high-water mark does not. A full case whose
estimated peak (`full_path_bytes`) does not fit in MemAvailable is not run; its figures are then
extrapolated linearly in tokens from the largest measured full case (every term is linear in
tokens), and the row says so. The last table is arithmetic for a 32K-token micro-batch at
Qwen3-14B's hidden size (5120), from the same byte counts.

    flock /tmp/rstar2-cpu.lock python benchmarks/timing/bench_logprobs.py --tokens 2048 4096 8192 --hidden 256 \\
        --json runs/bench_logprobs.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, add_json_option, write_json  # noqa: E402

VOCAB = 151_936
GIB = 1024 ** 3
EPS_LOW, EPS_HIGH = 0.2, 0.28


def full_logits_logprobs(logits, targets):
    """The full-logits path: (log p(target), entropy) per row of `logits` [N, V], upcast to fp32;
    the entropy (for logging) from a second log-softmax, without gradient."""
    import torch

    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
    with torch.no_grad():
        all_logp = torch.log_softmax(logits, dim=-1)
        entropy = -(all_logp.exp() * all_logp).sum(-1)
    return logp, entropy


def full_path_bytes(tokens: int, vocab: int, logits_bytes: int) -> int:
    """Peak of the full path, at the entropy: the head's logits (plus their fp32 copy when the head
    runs in bf16), the log-softmax kept for backward, and the entropy's log-softmax, exp and product."""
    return tokens * vocab * ((4 if logits_bytes == 4 else logits_bytes + 4) + 4 * 4)


def chunked_path_bytes(tokens: int, vocab: int, hidden: int, chunk: int, logits_bytes: int) -> int:
    """Peak of the chunked path: one chunk's logits and exponentials in fp32 (the bf16 matmul output
    and gradient of a bf16 head fit in the same 8 bytes, as they are alive one at a time beside
    them), the fp32 weight-gradient accumulator (plus its per-chunk product when the head runs in
    bf16) and the hidden-state gradient."""
    per_chunk = min(chunk, tokens) * vocab * 8
    weight_grad = vocab * hidden * (4 if logits_bytes == 4 else 4 + logits_bytes)
    return per_chunk + weight_grad + tokens * hidden * logits_bytes


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def worker(path: str, tokens: int, hidden: int, chunk: int, seed: int) -> dict:
    import torch
    import torch.nn.functional as F

    # lazy: torch; the case's subprocess only (the launcher reads MemAvailable)
    from rstar2_cli.rl.update.logprobs import token_logprobs_with_loss
    # lazy: torch; the case's subprocess only (the launcher reads MemAvailable)
    from rstar2_cli.rl.update.loss import clip_higher_loss

    torch.manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(VOCAB, hidden) * hidden ** -0.5)
    h_all = torch.randn(tokens, hidden)
    targets_all = torch.randint(0, VOCAB, (tokens,))
    old_all = -torch.rand(tokens) * 12
    adv_all = torch.randn(tokens)

    def run(n: int) -> float:
        h = h_all[:n].clone().requires_grad_(True)
        targets, old, adv, mask = targets_all[:n], old_all[:n], adv_all[:n], torch.ones(n)
        weight.grad = None
        if path == "full":
            logp, _entropy = full_logits_logprobs(F.linear(h, weight), targets)
            loss = clip_higher_loss(logp, old, adv, mask, n, EPS_LOW, EPS_HIGH)
        else:
            def token_loss(lp, sl):
                return clip_higher_loss(lp, old[sl], adv[sl], mask[sl], n, EPS_LOW, EPS_HIGH)
            loss, _logp, _entropy = token_logprobs_with_loss(h, weight, targets, chunk, token_loss, with_entropy=True)
        loss.backward()
        assert h.grad is not None and weight.grad is not None
        return float(loss.detach())

    run(min(256, tokens))                       # kernels, thread pool, allocator
    weight.grad = None
    Path("/proc/self/clear_refs").write_text("5")
    base_kib = _status_kib("VmRSS")
    with Stopwatch() as sw:
        loss = run(tokens)
    return {"path": path, "tokens": tokens, "hidden": hidden, "chunk": chunk, "loss": loss,
            "peak_gib": (_status_kib("VmHWM") - base_kib) * 1024 / GIB, "seconds": sw.seconds}


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def run_case(path: str, tokens: int, hidden: int, chunk: int, seed: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", path, "--tokens", str(tokens), "--hidden", str(hidden),
           "--chunk", str(chunk), "--seed", str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} at {tokens} tokens failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def arithmetic(tokens: int, hidden: int, chunk: int) -> list[dict]:
    rows = []
    for name, b in (("fp32", 4), ("bf16", 2)):
        full = full_path_bytes(tokens, VOCAB, b)
        chunked = chunked_path_bytes(tokens, VOCAB, hidden, chunk, b)
        rows.append({"dtype": name, "tokens": tokens, "hidden": hidden, "chunk": chunk,
                     "full_bytes": full, "chunked_bytes": chunked, "ratio": chunked / full})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    add_json_option(ap)
    ap.add_argument("--worker", choices=("full", "chunked"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokens[0], args.hidden, args.chunk, args.seed)))
        return

    results: list[dict] = []
    for tokens in sorted(args.tokens):
        need = full_path_bytes(tokens, VOCAB, 4) + VOCAB * args.hidden * 8
        avail = _mem_available()
        if need < 0.9 * avail:
            results.append(run_case("full", tokens, args.hidden, args.chunk, args.seed))
        else:
            measured = [r for r in results if r["path"] == "full" and not r.get("extrapolated")]
            if not measured:
                raise SystemExit(f"full path at {tokens} tokens needs ~{_gb(need)}, {_gb(avail)} available, "
                                 "and no smaller full case to extrapolate from: add a smaller --tokens")
            ref = measured[-1]
            scale = tokens / ref["tokens"]
            results.append({"path": "full", "tokens": tokens, "hidden": args.hidden, "chunk": args.chunk,
                            "peak_gib": ref["peak_gib"] * scale, "seconds": ref["seconds"] * scale,
                            "extrapolated": f"from {ref['tokens']} tokens: needs ~{_gb(need)}, {_gb(avail)} available"})
        results.append(run_case("chunked", tokens, args.hidden, args.chunk, args.seed))

    print(f"\nlog-prob pass, forward + backward; vocab {VOCAB}, hidden {args.hidden}, chunk {args.chunk}, fp32 CPU")
    print("| tokens | path | peak GiB | predicted GiB | time s | peak / full | time / full | loss |")
    print("|---|---|---|---|---|---|---|---|")
    full_of = {r["tokens"]: r for r in results if r["path"] == "full"}
    for r in results:
        f = full_of[r["tokens"]]
        r["peak_over_full"] = r["peak_gib"] / f["peak_gib"]
        r["time_over_full"] = r["seconds"] / f["seconds"]
        predicted = (full_path_bytes(r["tokens"], VOCAB, 4) if r["path"] == "full" else
                     chunked_path_bytes(r["tokens"], VOCAB, args.hidden, args.chunk, 4))
        r["predicted_gib"] = predicted / GIB
        label = r["path"] + (" (extrapolated)" if r.get("extrapolated") else "")
        loss = f"{r['loss']:.6f}" if "loss" in r else "-"
        print(f"| {r['tokens']} | {label} | {r['peak_gib']:.2f} | {r['predicted_gib']:.2f} | {r['seconds']:.1f} | "
              f"{r['peak_over_full']:.3f} | {r['time_over_full']:.2f} | {loss} |")
    for r in results:
        if r.get("extrapolated"):
            print(f"  full at {r['tokens']} tokens not run: {r['extrapolated']}")

    arith = arithmetic(32_768, 5120, args.chunk)
    print(f"\narithmetic: 32768 tokens, hidden 5120 (Qwen3-14B), chunk {args.chunk}; head matmul FLOPs "
          f"(logits, d hidden, d weight) 3 x 2 x T x H x V = {3 * 2 * 32768 * 5120 * VOCAB / 1e12:.0f} TFLOP "
          "on both paths")
    print("| head dtype | full path peak | chunked peak | chunked / full |")
    print("|---|---|---|---|")
    for a in arith:
        print(f"| {a['dtype']} | {_gb(a['full_bytes'])} | {_gb(a['chunked_bytes'])} | {a['ratio']:.3f} |")
    write_json(args.json, {"vocab": VOCAB, "results": results, "arithmetic_32k": arith})


if __name__ == "__main__":
    main()
