"""The docs' copy-paste commands run as written: every `rstar2 ...` line of the bash blocks in the
README and docs/ names
a real command whose options and values the CLI accepts (parsed by the CLI's own parser, nothing
run), and every `make ...` line names a Makefile target. A renamed flag or command fails here
instead of in a researcher's shell."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from rstar2_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]


def bash_lines(markdown: str) -> list[str]:
    """The command lines of the ```bash blocks, comments dropped."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        lines += [line for line in (shlex.split(raw, comments=True) for raw in block.splitlines()) if line]
    return [shlex.join(line) for line in lines]


def rstar2_args(line: str) -> list[str] | None:
    """The arguments after `rstar2` (also behind srun/torchrun as `$(which rstar2)`), else None."""
    words = shlex.split(line)
    for i, word in enumerate(words):
        if word == "rstar2" or word.endswith("which rstar2)"):
            return words[i + 1:]
    return None


def parse(args: list[str]):
    """Parse `args` down the command tree as the CLI would before running; the leaf command.
    A bad command, option or value raises the CLI's usage error (a `typer.TyperException`)."""
    command = get_command(app)
    ctx = command.make_context("rstar2", list(args), resilient_parsing=False)
    rest = list(args)
    while hasattr(command, "resolve_command"):    # a group: on to its subcommand
        name, command, rest = command.resolve_command(ctx, rest)
        assert command is not None, f"no command {name!r}"
        ctx = command.make_context(name, rest, parent=ctx)
    return command


README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RSTAR2_LINES = [(doc.relative_to(ROOT).as_posix(), line) for doc in DOCS for line in bash_lines(doc.read_text())
                if rstar2_args(line) is not None]


def test_the_readme_has_the_recipe_as_commands():
    readme = [line for doc, line in RSTAR2_LINES if doc == "README.md"]
    for step in ("prepare math", "sft", "rl --stage 1", "rl --stage 2", "prepare hard", "rl --stage 3", "eval all"):
        assert any(f" {step}" in line for line in readme), step


@pytest.mark.parametrize("doc, line", RSTAR2_LINES)
def test_each_rstar2_command_in_the_docs_parses(doc, line):
    try:
        parse(rstar2_args(line))
    except typer.TyperException as e:
        pytest.fail(f"{doc}: `{line}`: {e.format_message()}")


def test_a_wrong_flag_is_caught():
    with pytest.raises(typer.TyperException, match="--gpu"):
        parse(["rl", "--stage", "1", "--gpu", "8"])


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_each_make_command_in_the_readme_is_a_target():
    targets = [shlex.split(line)[1] for line in bash_lines(README) if line.startswith("make ")]
    assert {"quickstart", "test"} <= set(targets)
    for target in targets:
        out = subprocess.run(["make", "-n", "-f", str(ROOT / "Makefile"), target], cwd=ROOT, capture_output=True,
                             text=True)
        assert "No rule to make target" not in out.stderr, target
