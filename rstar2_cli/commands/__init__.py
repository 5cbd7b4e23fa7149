"""CLI subcommands (one module each, see `rstar2_cli.cli`) and the one way they report bad input."""
from __future__ import annotations

from typing import Any, NoReturn

import typer


def one_line(message: str) -> str:
    """`message` with its line breaks folded into spaces: an error is always one line."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def shown(value: Any) -> str:
    """A value as an error names it: as typed, quoted only when empty or holding spaces."""
    text = str(value)
    return repr(text) if not text or any(c.isspace() for c in text) else text


def fail(message: str) -> NoReturn:
    """Print `error: message` (one line, red on a terminal) on stderr and exit with status 2
    (a usage/input error)."""
    typer.secho(f"error: {one_line(message)}", fg="red", err=True)
    raise typer.Exit(2) from None
