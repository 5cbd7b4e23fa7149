"""The `rstar2` command line: one Typer app, one thin module per command family.

Each module under `rstar2_cli/commands/` defines `register(app)`; it parses flags, loads a
config and calls one function of the core. Heavy imports (torch, vllm, transformers) happen
inside the command functions so that `rstar2 --help` and `rstar2 serve-sandbox` start fast.
"""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="rstar2",
    help="rStar2-Agent toolkit: prepare data, SFT, agentic RL with GRPO-RoC, sandbox, evaluation.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)

# Order here is the order in `rstar2 --help`.
COMMAND_MODULES = [
    "quickstart",
    "prepare",
    "sft",
    "rl",
    "eval",
    "sandbox",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"rstar2_cli.commands.{_name}").register(app)


@app.command()
def version() -> None:
    """Print the rstar2 version."""
    from rstar2_cli import __version__

    typer.echo(__version__)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # `python -m rstar2_cli.cli ...`
    main()
