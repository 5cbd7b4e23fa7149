"""The GPU acceptance checks, in the order a new node should pass them, from one command.

Why one entry point: before a multi-node RL run, a node must show that the installed vLLM and torch
have every API the GPU path calls, that the weight sync and sharding hold on the real model's
shapes, that the policy update runs at a sane MFU, and that two RL steps through vLLM's weight
transfer leave the engines scoring what the trainer scores; the trainer proof shows the trainer
side alone at the real widths (no vLLM needed). Each check is its own script (run
alone for its options); this runs them one after another, each in its own process, and reports
one line per check and a JSON summary. The first two need no GPU.

    python benchmarks/gpu/acceptance.py                              # every check, results in runs/gpu_checks/
    python benchmarks/gpu/acceptance.py --only apis shapes           # the ones that run without a GPU
    python benchmarks/gpu/acceptance.py --list
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: harness

from harness import Stopwatch, write_json  # noqa: E402

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Check:
    name: str
    what: str
    gpus: int                   # GPUs it needs (0: runs anywhere)
    argv: tuple[str, ...]       # the script in this folder and its arguments; {out}: the output folder


CHECKS = (
    Check("apis", "every vLLM / torch.distributed API the GPU path calls exists and takes the arguments passed",
          0, ("check_gpu_apis.py",)),
    Check("shapes", "weight sync and sharding on Qwen3-14B's real shapes, on the meta device",
          0, ("gpu_shapes_check.py", "--model", "qwen3-14b")),
    Check("trainer_proof", "the trainer side at Qwen3-14B widths, sized so the update's plan fits the card: sharded "
          "load, chunked head, packed attention, FSDP2 update memory against the plan, MFU, DCP round trip, "
          "engine headroom after continue_optimizer, spawn environment, CUDA IPC",
          1, ("gpu_trainer_proof.py", "--out", "{out}/gpu_trainer_proof.json")),
    Check("smoke", "the policy update's tokens/s, MFU and peak memory; the sharded model load",
          1, ("gpu_smoke.py", "--out", "{out}/gpu_smoke.json")),
    Check("rl_smoke", "two RL steps per weight-sync backend through vLLM's weight transfer (nccl: 2 GPUs)",
          1, ("gpu_rl_smoke.py", "--out", "{out}/gpu_rl_smoke.json", "--work", "{out}/rl_smoke_work")),
)


def command(check: Check, out: Path) -> list[str]:
    script, *args = check.argv
    return [sys.executable, str(HERE / script), *(a.format(out=out) for a in args)]


def run_checks(checks: list[Check], out: Path) -> list[dict]:
    """Run each check in turn (all of them, also after a failure); one result per check."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for check in checks:
        log = out / f"{check.name}.log"
        with Stopwatch() as sw, log.open("w") as f:
            code = subprocess.run(command(check, out), stdout=f, stderr=subprocess.STDOUT).returncode
        results.append({"check": check.name, "exit_code": code, "passed": code == 0,
                        "seconds": round(sw.seconds, 1), "log": str(log)})
        print(f"{check.name:9s} {'passed' if code == 0 else f'FAILED (exit {code})':18s} "
              f"{results[-1]['seconds']:7.1f} s  {log}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=[c.name for c in CHECKS], help="run these checks only")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_checks"), help="logs, JSON results, summary.json")
    ap.add_argument("--list", action="store_true", help="list the checks and exit")
    args = ap.parse_args(argv)
    checks = [c for c in CHECKS if not args.only or c.name in args.only]
    if args.list:
        for c in checks:
            print(f"{c.name:9s} {c.gpus} GPU  {c.what}")
        return 0
    results = run_checks(checks, args.out)
    write_json(args.out / "summary.json", results)
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
