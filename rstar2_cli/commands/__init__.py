"""CLI subcommands (one module each, see `rstar2_cli.cli`) and the one way they report bad input."""
from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print `error: message` in red on stderr and exit with status 2 (a usage/input error)."""
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(2) from None
