"""`rstar2 inspect RUN_DIR`: flags only; the work is in `rstar2_cli.inspector`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rstar2_cli.commands import fail


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect_cmd(
        run_dir: Path = typer.Argument(..., help="An RL run folder (metrics.jsonl, rollouts/), an eval output "
                                                 "folder (results.json, trajectories.jsonl; `eval all`'s too), or "
                                                 "a folder of RL runs (a quickstart's: a page for each)."),
        out: Optional[Path] = typer.Option(None, "--out", "-o",
                                           help="The page to write [default: RUN_DIR/inspect.html]."),
        serve: Optional[int] = typer.Option(
            None, "--serve", min=0, max=65535,
            help="Serve the page and RUN_DIR read-only on 127.0.0.1:PORT until Ctrl-C (0: any free port), "
                 "writing no file: the page loads each RL step's trajectories from the server when opened."),
        max_trajectories: int = typer.Option(2000, "--max-trajectories", min=0,
                                             help="Trajectories embedded in the page, sampled evenly over steps "
                                                  "(--serve: eval folders only; RL steps load whole)."),
    ) -> None:
        """Write a self-contained HTML page to browse a run's trajectories: curves, steps, groups, turns,
        RoC decisions, filters. Prints the page's path (with --serve, the address instead)."""
        from rstar2_cli.inspector.page import PAGE_FILE, render_page, write_page  # lazy: pydantic, for --help (cli.py)
        # lazy: pydantic, for --help (cli.py)
        from rstar2_cli.inspector.reader import InspectError, read_folder, rl_runs_under

        if serve is not None and out is not None:
            fail(f"--out {out} with --serve: --serve writes no file (its page loads each step from the server); "
                 f"give one of them")
        runs = rl_runs_under(run_dir) if run_dir.is_dir() else []
        if len(runs) > 1 and (serve is not None or out is not None):
            fail(f"{run_dir}: holds {len(runs)} RL runs ({', '.join(str(r) for r in runs)}); "
                 f"{'--serve' if serve is not None else '--out'} takes one: give its folder")
        if runs:    # a folder of runs (a quickstart's rl_roc/ and rl_grpo/): a page for each
            for run in runs:
                try:
                    typer.echo(f"{run.relative_to(run_dir)}: "
                               f"{write_page(read_folder(run, max_trajectories), out or run / PAGE_FILE)}")
                except InspectError as e:
                    fail(str(e))
            return
        try:
            data = read_folder(run_dir, max_trajectories, on_demand=serve is not None)
        except InspectError as e:
            fail(str(e))
        if serve is None:
            target = out if out is not None else run_dir / PAGE_FILE
            try:
                typer.echo(str(write_page(data, target)))
            except OSError as e:
                fail(f"--out {target}: cannot write the page ({e.strerror or e})")
            return
        from rstar2_cli.inspector.serve import make_server, serve_until_interrupted  # lazy: http.server, for --serve

        try:
            server = make_server(run_dir, serve, render_page(data).encode())
        except OSError as e:
            fail(f"--serve {serve} on 127.0.0.1: {e.strerror or e}")
        serve_until_interrupted(server, announce=typer.echo)
