"""What `rstar2 rl` runs: directly in this process, under torchrun, or printed for each node.

`python -m rstar2_cli.rl.run.launch_entry --config resolved_recipe.yaml [--resume [auto]]` is the
module torchrun starts on every rank (see `rstar2_cli/launch/topology.py`), so a multi-GPU run
executes the same code as a CPU run: `run`, which the one-device launch calls in-process too.

Exit codes, of a trainer process and of `rstar2 rl`: 0 done; 75 (`PREEMPTED_EXIT_CODE`) stopped
by SIGTERM/SIGUSR1 after a checkpoint, continue with `--resume auto` (`rl/run/preemption.py`); 1 the
run aborted (`RunAborted`: one line saying why); 2 a bad recipe or data file. The node launcher forwards
SIGTERM and SIGUSR1 to torchrun, which forwards them to its workers (the plan's node environment,
`preemption.torchrun_env`, tells it to). From a terminal, the trainer (or torchrun) runs in a session of
its own and gets Ctrl-C from the launcher alone (`rl/run/own_session.py`).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from rstar2_cli.config import ConfigError, RecipeConfig, check_placement, load_recipe
from rstar2_cli.data.problems import DataError
from rstar2_cli.launch.plan_view import command_lines
from rstar2_cli.rl.ranks.dist import setup_distributed
from rstar2_cli.rl.run.faults import FaultPlan, RunAborted
from rstar2_cli.rl.run.own_session import again_in_own_session, at_a_terminal, call_forwarding_signals
from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE, RESUME_MODES, Preempted
from rstar2_cli.rl.run.resume import ResumeError
from rstar2_cli.rl.run.rollout_side import Collaborators
from rstar2_cli.rl.run.trainer import RLTrainer


def train(cfg: RecipeConfig, *, resume: bool | str = False, progress: bool = True,
          on_step: Callable[[int, dict], None] | None = None, collaborators: Collaborators = Collaborators()) -> Path:
    """Run one RL stage; returns the final checkpoint folder (a plain HF model inside)."""
    return RLTrainer(cfg, resume=resume, progress=progress, on_step=on_step, collaborators=collaborators).train()


def run(cfg, *, resume: bool | str, collaborators: Collaborators | None = None) -> Path:
    """What every trainer process runs: start torch.distributed (`rl/ranks/dist.py`; a no-op without
    torchrun), check the recipe's placement for the device this process got (`config.py`: a
    ConfigError; an "auto" micro-batch becomes CPU_MICRO_BATCH_TOKENS on CPU), then train.
    Without `collaborators`, the real collaborators, with the faults the environment injects (the one place
    it is read: `faults.FaultPlan.from_env`). Returns the final checkpoint folder."""
    info = setup_distributed()
    cfg = check_placement(cfg, on_gpu=info.device.type == "cuda")
    if collaborators is None:
        try:
            collaborators = Collaborators(faults=FaultPlan.from_env(os.environ))
        except ValueError as e:
            raise ConfigError(str(e)) from None
    return train(cfg, resume=resume, collaborators=collaborators)


def run_for_exit_code(cfg, *, resume: bool | str, quiet: bool = False,
                      collaborators: Collaborators | None = None) -> tuple[int, Path | None]:
    """`run`, its outcome as (exit code, final checkpoint or None); the reason of a non-zero
    code is printed as one line on stderr (unless `quiet`: ranks other than 0 say nothing)."""
    code, why = 0, None
    try:
        return 0, run(cfg, resume=resume, collaborators=collaborators)
    except (ConfigError, DataError, ResumeError) as e:
        code, why = 2, f"error: {e}"
    except Preempted as e:
        code, why = PREEMPTED_EXIT_CODE, str(e)
    except RunAborted as e:
        code, why = 1, f"error: {e}"
    if not quiet:
        print(why, file=sys.stderr, flush=True)
    return code, None


def node_name() -> str:
    """This node's name as the scheduler knows it (SLURM's SLURMD_NODENAME), else its hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def launch(plan, cfg, *, resume: bool | str, console, node_rank: int | None = None) -> int:
    """Run the plan: in-process for one device; torchrun on one node, or on node `node_rank` of
    several (given, or SLURM_NODEID); else print every node's command. Returns the exit code
    (module docstring)."""
    if plan.launch_mode == "direct":
        if at_a_terminal():   # the trainer and its engines out of reach of the terminal's Ctrl-C (own_session.py)
            _, _, module, *args = plan.nodes[0].launch      # python -m rstar2_cli.rl.run.launch_entry ...
            return again_in_own_session(module, args)
        code, final = run_for_exit_code(cfg, resume=resume)
        if final is not None:
            console.print(f"[green]done[/]: final checkpoint {final}")
        return code
    if len(plan.nodes) == 1 or node_rank is not None:
        node = plan.nodes[node_rank or 0]
        console.print(f"launching node {node.node_rank}: {node.command}")
        code = call_forwarding_signals(list(node.launch), {**os.environ, **dict(node.env)},
                                       own_session=at_a_terminal())
        if len(plan.nodes) > 1 and code not in (0, PREEMPTED_EXIT_CODE):
            # torchrun's report is many lines; a job log of several nodes needs the one that says where
            print(f"error: node {node.node_rank} ({node_name()}): its trainers failed, torchrun exit code {code} "
                  "(its report above names the rank); the other nodes stop with it", file=sys.stderr, flush=True)
        return code
    console.print("[bold]Run these on each node[/] (sandbox cluster first):")
    for line in command_lines(plan):
        console.print(line, soft_wrap=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rstar2_cli.rl.run.launch_entry")
    ap.add_argument("--config", required=True, help="a resolved recipe YAML")
    ap.add_argument("--resume", nargs="?", const="latest", default=None, choices=RESUME_MODES,
                    help="latest (the default value): the latest checkpoint; auto: it if there is one, else fresh")
    args = ap.parse_args(argv)
    try:
        cfg = load_recipe(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    quiet = os.environ.get("RANK", "0") != "0"
    code, final = run_for_exit_code(cfg, resume=args.resume, quiet=quiet)
    if final is not None and not quiet:
        print(f"done: final checkpoint {final}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
