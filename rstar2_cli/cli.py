"""The `rstar2` command line: one Typer app, one thin module per command family.

Each module under `rstar2_cli/commands/` defines `register(app)`; it parses flags, loads a
config and calls one function of the core. `rstar2 --help` imports every command module, so what
they import at their tops is typer, rich and light leaves (`commands.checks`, `data.problems`,
`rl.preemption`); it runs in 0.18 s wall (best of 5, a shared 2-core box). A command imports the rest
(pydantic for the configs, ~0.12 s; fastapi and redis for the sandbox service; torch, transformers
and vLLM for training) inside its function, each import marked `# lazy:` with what it would cost
(tests/layout/test_imports_at_top.py); a command that can refuse its input imports its trainer
after the checks.
"""
from __future__ import annotations

import importlib
import sys

import typer

from rstar2_cli import __version__
from rstar2_cli.commands import one_line, shown


def usage_message(e: typer.TyperException) -> str:
    """What a usage error says. A value Typer's own checks refused (its pydantic validation: a
    range, a type) is named with its flag, `--port 99999: Input should be less than or equal to
    65535`, as `commands.checks` names the values it refuses."""
    param, errors = getattr(e, "param", None), getattr(e.__cause__, "errors", None)
    first = errors()[0] if callable(errors) and errors() else {}
    if param is None or "input" not in first:
        return e.format_message()
    name = param.opts[0] if param.param_type_name == "option" and param.opts else param.human_readable_name
    return f"{name} {shown(first['input'])}: {e.message}"


class OneLineErrorsTyper(typer.Typer):
    """A Typer app that, run as a program, reports a usage error (unknown flag, missing argument,
    a value outside its range) as one `error: ...` line on stderr with exit status 2, the same
    form as `commands.fail`, instead of Typer's multi-line boxed panel. `typer.testing.CliRunner`
    drives the underlying command directly and still sees Typer's own format."""

    def __call__(self, *args, **kwargs):
        try:
            code = super().__call__(*args, standalone_mode=False, **kwargs)
        except typer.TyperException as e:       # click's ClickException and its usage errors
            if type(e).__name__ == "NoArgsIsHelpError":     # `rstar2` alone: the help is the answer
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            typer.secho(f"error: {where}{one_line(usage_message(e))}{hint}", fg="red", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = OneLineErrorsTyper(
    name="rstar2",
    help="rStar2-Agent toolkit: prepare data, SFT, agentic RL with GRPO-RoC, sandbox, evaluation.",
    rich_markup_mode=None,   # click's plain help: it wraps at any width (rich's panels cut flag names at 80)
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
    "preflight",
    "inspect",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"rstar2_cli.commands.{_name}").register(app)


@app.command()
def version() -> None:
    """Print the rstar2 version."""
    typer.echo(__version__)


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # `python -m rstar2_cli.cli ...`
    main()
