"""An option that stands for a setting has no default of its own: it shows and uses the setting's
one default (`rstar2 eval`'s are EvalSettings', eval/settings.py; `rstar2 quickstart`'s the
QuickstartSettings' or its preset's), or none at all where the value comes from a recipe
(`prepare hard`'s rollout options: the policy's run recipe, prepare/mine_hard.py). Read from the Click
command the CLI builds, so a literal written into an option shows up here."""
from __future__ import annotations

from typer.main import get_command

from rstar2_cli.cli import app
from rstar2_cli.eval.settings import EvalSettings
from rstar2_cli.quickstart.settings import QuickstartSettings


def _defaults(*path: str) -> dict:
    command = get_command(app)
    for name in path:
        command = command.commands[name]
    return {p.name: p.default for p in command.params}


def test_eval_options_default_to_the_eval_settings():
    options = _defaults("eval")
    settings = {name for name, field in EvalSettings.model_fields.items() if not field.is_required()}
    shared = settings & set(options)
    assert {"samples", "temperature", "top_p", "max_tokens", "max_turns", "answer_mode", "seed_requests"} <= shared
    assert {name: options[name] for name in shared} == {name: EvalSettings.default_of(name) for name in shared}


def test_prepare_hard_rollout_options_default_to_the_recipe():
    options = _defaults("prepare", "hard")
    assert {options[name] for name in ("max_turns", "max_tokens", "temperature", "top_p", "data", "out")} == {None}


def test_quickstart_options_default_to_the_settings_or_the_preset():
    options = _defaults("quickstart")
    fields = QuickstartSettings.model_fields
    shared = set(options) & set(fields)
    assert {"seed", "compare_grpo", "max_staleness"} <= shared
    assert {name: options[name] for name in shared} == {
        name: None if options[name] is None else fields[name].get_default() for name in shared}
