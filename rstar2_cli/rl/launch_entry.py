"""What `rstar2 rl` runs: directly in this process, under torchrun, or printed for each node.

`python -m rstar2_cli.rl.launch_entry --config resolved_recipe.yaml [--resume]` is the module
torchrun starts on every rank (see `rstar2_cli/launch/topology.py`), so a multi-GPU run executes
the same code as a CPU run: `run`, which the one-device launch calls in-process too.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def run(cfg, *, resume: bool) -> Path:
    """What every trainer process runs: start torch.distributed (`rl/dist.py`; a no-op without
    torchrun), check the recipe's placement for the device this process got (`config.py`: a
    ConfigError), then train. Returns the final checkpoint folder."""
    from rstar2_cli.config import check_placement
    from rstar2_cli.rl.dist import setup_distributed
    from rstar2_cli.rl.trainer import train

    info = setup_distributed()
    check_placement(cfg, on_gpu=info.device.type == "cuda")
    return train(cfg, resume=resume)


def launch(plan, cfg, *, resume: bool, console, node_rank: int | None = None) -> int:
    """Run the plan: in-process for one device; torchrun on one node, or on node `node_rank` of
    several (given, or SLURM_NODEID); else print every node's command."""
    from rstar2_cli.config import ConfigError
    from rstar2_cli.launch.plan_view import command_lines

    if plan.launch_mode == "direct":
        try:
            final = run(cfg, resume=resume)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        console.print(f"[green]done[/]: final checkpoint {final}")
        return 0
    if len(plan.nodes) == 1 or node_rank is not None:
        node = plan.nodes[node_rank or 0]
        console.print(f"launching node {node.node_rank}: {node.command}")
        return subprocess.call(list(node.launch), env={**os.environ, **dict(node.env)})
    console.print("[bold]Run these on each node[/] (sandbox cluster first):")
    for line in command_lines(plan):
        console.print(line, soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rstar2_cli.rl.launch_entry")
    ap.add_argument("--config", required=True, help="a resolved recipe YAML")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    from rstar2_cli.config import ConfigError, load_recipe

    try:
        run(load_recipe(args.config), resume=args.resume)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
