"""End to end: `rstar2 sft` on 8 conversations lowers the loss and writes a loadable HF checkpoint;
a LoRA run's merged checkpoint computes the same logits as base + adapter."""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from rstar2_cli.cli import app
from rstar2_cli.protocol.template import chat_template, encode_messages
from rstar2_cli.sft.settings import SftConfig
from rstar2_cli.sft.trainer import run_sft


def _probe_ids(tok):
    msgs = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "The answer is 5."}]
    return torch.tensor([encode_messages(tok, msgs)])


@pytest.mark.slow
def test_cli_sft_lowers_the_loss_and_writes_a_loadable_checkpoint(tiny_model, sft_file, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = tmp_path / "sft.yaml"
    recipe.write_text(yaml.safe_dump({
        "model": str(tiny_model), "data": [str(sft_file)], "out_dir": str(tmp_path / "run"), "max_steps": 6,
        "lr": 2e-3, "warmup_ratio": 0.1, "batch_size": 4, "per_device_batch_size": 4, "max_length": 1024,
        "packing": True, "gradient_checkpointing": False, "logging_steps": 1, "save_steps": 3}))
    res = CliRunner().invoke(app, ["sft", str(recipe)])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "run" / "sft_summary.json").read_text())
    assert summary["examples"] == 8 and summary["steps"] == 6 and summary["lora"] is False
    assert summary["last_logged_loss"] < summary["first_logged_loss"] - 0.5, summary
    assert (tmp_path / "run" / "checkpoint-3" / "model.safetensors").is_file()   # intermediate HF checkpoint
    final = tmp_path / "run" / "final"
    assert summary["final_checkpoint"] == str(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    tok = AutoTokenizer.from_pretrained(final)
    assert tok.chat_template == chat_template()           # vLLM / HF users render with our template
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    ids = _probe_ids(tok)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits, atol=1e-3)   # the trained weights were saved


@pytest.mark.slow
def test_lora_merged_checkpoint_matches_base_plus_adapter(tiny_model, sft_file, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = SftConfig(model=str(tiny_model), data=[str(sft_file)], out_dir=str(tmp_path / "run"), max_steps=3,
                    lr=1e-2, batch_size=4, per_device_batch_size=4, max_length=1024, gradient_checkpointing=False,
                    logging_steps=1, lora={"r": 4, "alpha": 8, "dropout": 0.0})
    summary = run_sft(cfg, progress=False)
    assert summary["lora"] is True and summary["steps"] == 3
    final = tmp_path / "run" / "final"
    assert not (final / "adapter_config.json").exists()       # a plain HF folder, not an adapter
    merged = AutoModelForCausalLM.from_pretrained(final).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    ids = _probe_ids(AutoTokenizer.from_pretrained(final))
    with torch.no_grad():
        base_logits = base(ids).logits
        adapted = PeftModel.from_pretrained(base, str(tmp_path / "run" / "adapter")).eval()
        adapter_logits = adapted(ids).logits
        merged_logits = merged(ids).logits
    assert (adapter_logits - base_logits).abs().max() > 1e-3          # the adapter learned something
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-4, rtol=1e-4)
