"""`rstar2 eval` sends the release's prompt and tool protocol by default, and a recipe's when asked."""
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from rstar2_cli.config import RolloutConfig
from rstar2_cli.eval.settings import EvalSettings, protocol_of_recipe

REPO = Path(__file__).resolve().parents[2]


def test_default_eval_uses_the_releases_protocol_with_the_eval_budget():
    cfg = EvalSettings(benchmark="aime24", model="m").rollout_config()
    release = RolloutConfig()
    same = ("system_prompt", "tools_in_prompt", "force_reason", "response_format", "parse_messages", "code_runner",
            "tool_response_max_chars", "tool_timeout", "max_calls_per_turn", "tool_schema_return", "stop_at_tool_call")
    assert {f: getattr(cfg, f) for f in same} == {f: getattr(release, f) for f in same}
    assert (cfg.max_turns, cfg.max_response_tokens, cfg.temperature) == (30, 30000, 0.6)


def test_protocol_comes_from_an_rl_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"rollout": {"system_prompt": "Be brief.", "tools_in_prompt": False,
                                                  "response_format": "rstar2", "force_reason": False}}))
    cfg = EvalSettings(benchmark="aime24", model="m", **protocol_of_recipe(str(recipe))).rollout_config()
    assert (cfg.system_prompt, cfg.tools_in_prompt, cfg.response_format, cfg.force_reason) == \
        ("Be brief.", False, "rstar2", False)
    stage1 = REPO / "rstar2_cli" / "recipes" / "stage1.yaml"
    assert protocol_of_recipe(str(stage1))["protocol"]["response_format"] == "release"


def test_a_non_protocol_field_or_bad_value_is_refused():
    with pytest.raises(ValidationError, match="'max_turns' is not a protocol field"):
        EvalSettings(benchmark="aime24", model="m", protocol={"max_turns": 3})
    with pytest.raises(ValidationError, match="response_format"):
        EvalSettings(benchmark="aime24", model="m", protocol={"response_format": "verbose"})
