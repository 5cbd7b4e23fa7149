"""`rstar2 quickstart`: prepare -> sft -> rl -> eval on a toy task, on CPU, in one command."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from rstar2_cli.commands import checks, fail
from rstar2_cli.quickstart.report import results_table
from rstar2_cli.rollout.engine_logs import VERBOSE_ENV
from rstar2_cli.rl.run.own_session import again_in_own_session, at_a_terminal
from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE, Preempted, continue_command


def register(app: typer.Typer) -> None:
    @app.command("quickstart")
    def quickstart_cmd(
        seed: int = typer.Option(0, "--seed", help="changes the toy problems, the held-out set and the initialisation"),
        seeds: Optional[str] = typer.Option(
            None,
            "--seeds",
            help="comma-separated seeds, e.g. 0,1,2: one run per seed in OUT/seed_<n>, "
            "then mean ± spread and the RoC checks on every seed (replaces --seed)",
        ),
        out: str = typer.Option("runs/quickstart", "--out", help="output folder (report.json, report.png, report.md)"),
        compare_grpo: bool = typer.Option(
            False, "--compare-grpo", help="also run plain GRPO (RoC off) from the same SFT start"
        ),
        smoke: bool = typer.Option(False, "--smoke", help="a few-minute size preset (CI)"),
        verbose: bool = typer.Option(False, "--verbose",
                                     help="vLLM's log lines on the terminal too (default: OUT/rl_*/logs/)"),
        sft_steps: Optional[int] = typer.Option(None, "--sft-steps", min=1, help="override the preset's SFT steps"),
        steps: Optional[int] = typer.Option(None, "--steps", min=1, help="override the preset's RL steps"),
        eval_every: Optional[int] = typer.Option(None, "--eval-every", min=1, help="RL steps between held-out points"),
        max_staleness: Optional[int] = typer.Option(
            None,
            "--max-staleness",
            min=0,
            help="experimental asynchronous RL: roll out up to k steps ahead (0: the paper's synchronous step)",
        ),
    ) -> None:
        """Train a tiny model to use the Python tool, end to end on CPU, and write a report."""
        from pydantic import ValidationError  # lazy: pydantic, for --help's speed (cli.py)

        from rstar2_cli.config import RESOLVED_RECIPE, first_error  # lazy: pydantic, for --help's speed (cli.py)
        from rstar2_cli.quickstart.seeds import parse_seeds, run_seeds, seeds_table  # lazy: pydantic (cli.py)
        from rstar2_cli.quickstart.settings import QuickstartSettings  # lazy: pydantic, for --help (cli.py)

        try:
            seed_list = parse_seeds(seeds) if seeds is not None else None
            settings = QuickstartSettings.for_preset(out, "smoke" if smoke else "full", seed=seed,
                                                     compare_grpo=compare_grpo, sft_steps=sft_steps,
                                                     rl_steps=steps, eval_every=eval_every,
                                                     max_staleness=max_staleness)
        except ValidationError as e:
            fail(str(first_error(e, "quickstart")))
        except ValueError as e:
            fail(str(e))
        checks.output_dir(settings.out, "--out")
        from rstar2_cli.quickstart.pipeline import run_quickstart  # lazy: torch (the trainer), after the checks

        if verbose:      # read where the trainer starts its engines (rollout/engine_logs.py)
            os.environ[VERBOSE_ENV] = "1"
        if at_a_terminal():   # the trainer and engines out of reach of the terminal's Ctrl-C (rl/run/own_session.py)
            raise typer.Exit(again_in_own_session("rstar2_cli.cli", sys.argv[1:]))
        console = Console()
        try:
            if seed_list is not None:
                summary = run_seeds(settings, seed_list, run_quickstart)
                console.print(seeds_table(summary))
            else:
                console.print(results_table(run_quickstart(settings)))
        except Preempted as e:           # Ctrl-C or SIGTERM: the RL step finished and was saved
            typer.echo(str(e), err=True)
            if e.checkpoint is not None:
                recipe = Path(e.checkpoint).parent / RESOLVED_RECIPE
                typer.echo(f"continue its RL stage alone with: {continue_command(['rl', str(recipe)])} "
                           f"(no report: that needs the whole quickstart, which starts over when run again)",
                           err=True)
            raise typer.Exit(PREEMPTED_EXIT_CODE) from None
        console.print(f"report: {settings.out / 'report.md'}  curves: {settings.out / 'report.png'}  "
                      f"numbers: {settings.out / 'report.json'}")
