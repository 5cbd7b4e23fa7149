"""`rstar2 rl`: resolve a stage recipe, plan the launch, and run (or print) it."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rstar2_cli.commands import fail


def register(app: typer.Typer) -> None:
    @app.command("rl")
    def rl_cmd(
        recipe: Optional[str] = typer.Argument(None, help="recipe YAML (default: recipes/stageN.yaml for --stage N)"),
        stage: Optional[int] = typer.Option(None, "--stage", min=1, max=3, help="paper stage 1, 2 or 3"),
        overrides: List[str] = typer.Option([], "--set", help="override any field, e.g. --set optim.lr=2e-6 (repeatable)"),
        gpus: int = typer.Option(0, "--gpus", min=0, help="GPUs in all (0: CPU)"),
        nodes: int = typer.Option(1, "--nodes", min=1),
        master_addr: str = typer.Option("127.0.0.1", "--master-addr", help="head node address for multi-node rendezvous"),
        master_port: int = typer.Option(29500, "--master-port"),
        redis_url: Optional[str] = typer.Option(None, "--redis", help="sandbox cluster queue for multi-node runs"),
        resume: bool = typer.Option(False, "--resume", help="continue from the latest checkpoint in train.out_dir"),
        dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved config and launch plan, run nothing"),
    ) -> None:
        """Agentic RL with GRPO-RoC (paper stages 1-3)."""
        from rich.console import Console
        from rich.syntax import Syntax

        from rstar2_cli.config import ConfigError, dump_recipe
        from rstar2_cli.launch.plan_view import render_plan
        from rstar2_cli.launch.topology import PlanError, plan_from_args
        from rstar2_cli.rl.stages import resolve_stage_recipe

        console = Console()
        try:
            cfg = resolve_stage_recipe(recipe, stage, list(overrides))
        except ConfigError as e:
            fail(str(e))

        resolved_path = Path(cfg.train.out_dir) / "resolved_recipe.yaml"
        entry_args = ["--config", str(resolved_path)] + (["--resume"] if resume else [])
        try:
            plan = plan_from_args(
                gpus, nodes,
                tp_size=cfg.engine.tensor_parallel_size if gpus else 1,
                colocate=cfg.engine.colocate,
                redis_url=redis_url,
                master_addr=master_addr,
                master_port=master_port,
                recipe_args=tuple(entry_args),
                prompts_per_step=cfg.train.prompts_per_step,
                rollouts_per_prompt=cfg.rollouts_per_prompt,
            )
        except PlanError as e:
            fail(str(e))

        if dry_run:
            console.rule(f"resolved recipe: {cfg.name} (stage {cfg.stage})")
            console.print(Syntax(dump_recipe(cfg), "yaml"))
            console.print(render_plan(plan))
            return

        resolved_path.parent.mkdir(parents=True, exist_ok=True)
        resolved_path.write_text(dump_recipe(cfg))
        from rstar2_cli.rl.launch_entry import launch

        raise typer.Exit(launch(plan, cfg, resume=resume, console=console))
