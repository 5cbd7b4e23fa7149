"""`rstar2 inspect RUN_DIR`: flags only; the work is in `rstar2_cli.inspect`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rstar2_cli.commands import fail


def register(app: typer.Typer) -> None:
    @app.command("inspect")
    def inspect_cmd(
        run_dir: Path = typer.Argument(..., help="An RL run folder (metrics.jsonl, rollouts/) or an eval output "
                                                 "folder (results.json, trajectories.jsonl; `eval all`'s too)."),
        out: Optional[Path] = typer.Option(None, "--out", "-o",
                                           help="The page to write [default: RUN_DIR/inspect.html]."),
        serve: Optional[int] = typer.Option(
            None, "--serve", min=0, max=65535,
            help="Serve the page and RUN_DIR read-only on 127.0.0.1:PORT until Ctrl-C (0: any free port)."),
        max_trajectories: int = typer.Option(2000, "--max-trajectories", min=0,
                                             help="Trajectories embedded in the page, sampled evenly over steps."),
    ) -> None:
        """Write a self-contained HTML page to browse a run's trajectories: curves, steps, groups, turns,
        RoC decisions, filters. Prints the page's path."""
        from rstar2_cli.inspect.page import PAGE_FILE, write_page  # lazy: pydantic, for --help's speed (cli.py)
        from rstar2_cli.inspect.reader import InspectError, read_folder  # lazy: pydantic, for --help (cli.py)

        try:
            data = read_folder(run_dir, max_trajectories)
        except InspectError as e:
            fail(str(e))
        target = out if out is not None else run_dir / PAGE_FILE
        server = None
        if serve is not None:                    # the port first: a busy one fails before anything is written
            from rstar2_cli.inspect.serve import make_server, serve_until_interrupted  # lazy: http.server, for --serve

            try:
                server = make_server(target, run_dir, serve)
            except OSError as e:
                fail(f"--serve {serve} on 127.0.0.1: {e.strerror or e}")
        try:
            page = write_page(data, target)
        except OSError as e:
            if server is not None:
                server.server_close()
            fail(f"--out {target}: cannot write the page ({e.strerror or e})")
        typer.echo(str(page))
        if server is not None:
            serve_until_interrupted(server, announce=typer.echo)
