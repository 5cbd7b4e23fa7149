"""`rstar2 sft RECIPE`: non-reasoning SFT in the rStar2 tool format (TRL + optional LoRA)."""
from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from rstar2_cli.commands import checks, fail


def register(app: typer.Typer) -> None:
    @app.command("sft")
    def sft_cmd(
        recipe: Optional[str] = typer.Argument(None, help="SFT recipe YAML (e.g. rstar2_cli/recipes/sft.yaml)"),
        overrides: List[str] = typer.Option([], "--set", help="override a field, e.g. --set lora.r=16 (repeatable)"),
    ) -> None:
        """Supervised fine-tuning on tool-call / instruction / chat conversations (loss on assistant tokens only)."""
        from rstar2_cli.config import ConfigError  # lazy: pydantic, for --help's speed (cli.py)
        from rstar2_cli.sft.settings import load_sft_config  # lazy: pydantic, for --help's speed (cli.py)

        try:
            cfg = load_sft_config(recipe, list(overrides))
        except ConfigError as e:
            fail(str(e))
        checks.model_dir(cfg.model, "model")
        for path in cfg.data:
            checks.input_file(path, "data")
        checks.output_dir(cfg.out_dir, "out_dir")
        from rstar2_cli.sft.trainer import SftDataError, run_sft  # lazy: torch, transformers, TRL (~3 s)

        try:
            summary = run_sft(cfg)
        except (ConfigError, SftDataError) as e:
            fail(str(e))
        if int(os.environ.get("RANK", "0")) != 0:         # under torchrun only the main rank reports
            return
        table = Table(title="rstar2 sft")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key in ("examples", "dropped_too_long", "global_batch", "steps", "first_logged_loss",
                    "last_logged_loss", "train_loss", "lora", "final_checkpoint"):
            value = summary.get(key)
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
        console = Console()
        console.print(table)
        console.print(f"summary: {cfg.out_dir}/sft_summary.json")
