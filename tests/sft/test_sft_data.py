"""Bad SFT data and bad settings fail fast with one line naming the file:line or field; the
shipped recipe carries the paper's hyperparameters into TRL's arguments."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from sft_rows import chat_conversation, write_jsonl
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.config import ConfigError
from rstar2_cli.sft.data import SftDataError, load_conversations
from rstar2_cli.sft.settings import load_sft_config
from rstar2_cli.sft.trainer import _training_args

REPO = Path(__file__).resolve().parents[2]
GOOD = json.dumps(chat_conversation(0))


@pytest.mark.parametrize("bad, reason", [
    ('{"messages": [', "not valid JSON"),
    ('{"conversations": []}', "'messages' list"),
    ('{"messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]}',
     "unknown role 'robot'"),
    ('{"messages": [{"role": "user", "content": ["x"]}, {"role": "assistant", "content": "y"}]}',
     "content must be a string"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",'
     ' "tool_calls": [{"arguments": {}}]}]}', "tool_calls[0] needs a 'name'"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",'
     ' "tool_calls": [{"name": "f", "arguments": 3}]}]}', "needs 'arguments'"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], "tools": "f"}',
     "'tools' must be a list"),
])
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path, bad, reason):
    path = write_jsonl(tmp_path / "data.jsonl", [GOOD, "", bad])
    with pytest.raises(SftDataError) as e:
        load_conversations([str(path)])
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: ") and reason in msg and "\n" not in msg


def test_missing_file_is_named(tmp_path):
    with pytest.raises(SftDataError, match="nope.jsonl: SFT data file not found"):
        load_conversations([str(tmp_path / "nope.jsonl")])


def test_cli_reports_bad_data_in_one_line_and_exits_2(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [GOOD, '{"messages": [{"role": "user", "content": "hi"}]}'])
    res = CliRunner().invoke(app, ["sft", "--set", f"model={tiny_model}", "--set", f"data={path}",
                                   "--set", f"out_dir={tmp_path / 'run'}"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == [f"error: {path}:2: no assistant message to learn from"]


@pytest.mark.parametrize("override, field", [("lora.r=-1", "lora.r"), ("lr=0", "lr"),
                                             ("epoch=3", "epoch: unknown field"), ("packing=maybe", "packing")])
def test_bad_settings_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_sft_config(REPO / "rstar2_cli" / "recipes" / "sft.yaml", [override])
    assert field in str(e.value) and "rstar2_cli/recipes/sft.yaml" in str(e.value) and "\n" not in str(e.value)


def test_recipe_carries_the_papers_hyperparameters_into_trl():
    cfg = load_sft_config(REPO / "rstar2_cli" / "recipes" / "sft.yaml", ["lora.r=16"])
    assert (cfg.epochs, cfg.lr, cfg.warmup_ratio, cfg.lr_scheduler, cfg.batch_size) == (3, 5e-6, 0.04, "cosine", 128)
    assert cfg.lora.r == 16
    args = _training_args(cfg, on_gpu=False, bf16=False, world=8)
    assert args.num_train_epochs == 3 and args.learning_rate == 5e-6
    assert args.warmup_steps == 0.04                      # transformers 5: a float < 1 is a ratio
    assert args.lr_scheduler_type == "cosine"
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * 8 == 128


def test_worker_processes_tokenize_like_the_serial_path_and_report_bad_rows(tiny_model, monkeypatch):
    from sft_rows import eight_rows
    from transformers import AutoTokenizer

    from rstar2_cli.protocol.template import install_chat_template
    from rstar2_cli.sft import data

    tok = install_chat_template(AutoTokenizer.from_pretrained(tiny_model))
    rows = eight_rows()
    serial, _ = data.tokenize_conversations(tok, rows, 4096)
    monkeypatch.setattr(data, "_worker_count", lambda n: 2)
    pooled, _ = data.tokenize_conversations(tok, rows, 4096)
    assert pooled["input_ids"] == serial["input_ids"] and pooled["assistant_masks"] == serial["assistant_masks"]
    bad = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                        {"role": "robot", "content": "z"}], "_where": "f.jsonl:9"}
    with pytest.raises(SftDataError, match=r"^f\.jsonl:9: .*unknown message role robot$"):
        data.tokenize_conversations(tok, rows + [bad], 4096)


def test_conversations_truncated_to_no_assistant_token_are_dropped(tiny_model):
    from sft_rows import chat_conversation, tool_conversation
    from transformers import AutoTokenizer

    from rstar2_cli.protocol.template import install_chat_template
    from rstar2_cli.sft.data import tokenize_conversations
    from rstar2_cli.sft.masks import conversation_ids_and_mask

    tok = install_chat_template(AutoTokenizer.from_pretrained(tiny_model))
    short, long = chat_conversation(0), tool_conversation(2, 3)   # the tool list makes the second one long
    short_ids, short_mask = conversation_ids_and_mask(tok, short["messages"])
    first_trained = conversation_ids_and_mask(tok, long["messages"], long["tools"])[1].index(1)
    limit = len(short_ids) - 2                # cuts the short one's tail, keeps its assistant text
    assert short_mask[:limit].count(1) > 0 and first_trained >= limit
    ds, dropped = tokenize_conversations(tok, [short, long], limit)
    assert dropped == 1 and ds["input_ids"] == [short_ids[:limit]]
