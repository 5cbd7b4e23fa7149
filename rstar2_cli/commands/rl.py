"""`rstar2 rl`: resolve a stage recipe, plan the launch, and run (or print) it."""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.syntax import Syntax
from typer.core import TyperCommand

from rstar2_cli.commands import checks, fail
from rstar2_cli.hosts.cpu_ranks import CPU_RANKS_ENV, cpu_ranks
from rstar2_cli.rl.run import run_folder
from rstar2_cli.rl.run.preemption import PREEMPTED_EXIT_CODE, RESUME_MODES, continue_command, torchrun_env
from rstar2_cli.rollout.engine_logs import VERBOSE_ENV


def with_resume_default(args: list[str]) -> list[str]:
    """`--resume` with its optional value spelled out: a bare `--resume` (not followed by one of
    RESUME_MODES) means `--resume latest`, so `--resume`, `--resume auto` and `--resume=auto`
    all parse (click options take a value or none, not both)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        out.append(arg)
        if arg == "--resume" and (i + 1 >= len(args) or args[i + 1] not in RESUME_MODES):
            out.append("latest")
    return out


class _RlCommand(TyperCommand):
    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, with_resume_default(list(args)))


def register(app: typer.Typer) -> None:
    @app.command("rl", cls=_RlCommand)
    def rl_cmd(
        recipe: Optional[str] = typer.Argument(None, help="recipe YAML (default: the packaged "
                                                          "rstar2_cli/recipes/stageN.yaml for --stage N)"),
        stage: Optional[int] = typer.Option(None, "--stage", min=1, max=3, help="paper stage 1, 2 or 3"),
        overrides: List[str] = typer.Option([], "--set",
                                            help="override any field, e.g. --set optim.lr=2e-6 (repeatable)"),
        gpus: int = typer.Option(0, "--gpus", min=0,
                                 help="GPUs in all (0: CPU; with RSTAR2_CPU_RANKS=1 each is a CPU rank)"),
        nodes: Optional[int] = typer.Option(None, "--nodes", min=1,
                                            help="nodes (default: SLURM_JOB_NUM_NODES, else gpus / gpus-per-node)"),
        gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                    help="GPUs per node (default: this node's visible GPUs, else 8)"),
        node_rank: Optional[int] = typer.Option(None, "--node-rank", min=0,
                                                help="start this node's trainers (default: SLURM_NODEID; "
                                                     "without either, print every node's command)"),
        master_addr: Optional[str] = typer.Option(None, "--master-addr",
                                                  help="head node address (default: SLURM's first host, else "
                                                       "127.0.0.1; a multi-node --dry-run without either names "
                                                       "a placeholder)"),
        master_port: int = typer.Option(29500, "--master-port", min=1, max=65535),
        engine_gpus: Optional[int] = typer.Option(None, "--engine-gpus", min=1,
                                                  help="GPUs (over all nodes) that hold only engines, with "
                                                       "engine.colocate=false; the rest train"),
        redis_url: Optional[str] = typer.Option(None, "--redis", help="sandbox cluster queue for multi-node runs"),
        resume: Optional[str] = typer.Option(
            None, "--resume", metavar="[latest|auto]",
            help="continue from the latest checkpoint in train.out_dir (`--resume`: it must exist); "
                 "`--resume auto`: from it if there is one, else start fresh (a requeued job)"),
        dry_run: bool = typer.Option(False, "--dry-run", help="print the resolved config and launch plan, run nothing"),
        verbose: bool = typer.Option(False, "--verbose",
                                     help="vLLM's log lines on the terminal too (default: TRAIN.OUT_DIR/logs/)"),
        gpu_memory: Optional[str] = typer.Option(
            None, "--gpu-memory",
            help="the GPU to plan memory for (a dry run from a login node): GiB as torch reports them, or h100 (79.1), "
                 "h200 (139.8), mi300x (191.6) (default: this node's GPU, which a launch always plans for; "
                 "else mi300x, with a note)"),
    ) -> None:
        """Agentic RL with GRPO-RoC (paper stages 1-3), the paper's synchronous step.

        Experimental: --set train.max_staleness=k (k >= 1) rolls out up to k steps ahead of the
        trainer (docs/async-rl.md)."""
        from rstar2_cli import config  # lazy: pydantic, for --help's speed (cli.py)
        # lazy: pydantic and asyncio, for --help's speed (cli.py)
        from rstar2_cli.launch import cluster_env, engine_sizing, gpu_card, memory_plan, model_shape
        from rstar2_cli.launch import plan_view, topology  # lazy: pydantic and asyncio, for --help's speed (cli.py)
        from rstar2_cli.rl.run import launch_entry  # lazy: the trainer's entry and pydantic (cli.py)
        from rstar2_cli.rl.run import stages  # lazy: the trainer's entry and pydantic (cli.py)
        from rstar2_cli.rl.run.resume import ResumeError, resume_point  # lazy: torch (the checkpoint check)

        console = Console()
        if verbose:      # read by every trainer process this command starts (rollout/engine_logs.py)
            os.environ[VERBOSE_ENV] = "1"
        try:
            cpu = cpu_ranks()          # RSTAR2_CPU_RANKS=1: each of --gpus is a CPU rank (hosts/cpu_ranks.py)
        except ValueError as e:
            fail(str(e))
        on_gpu = gpus > 0 and not cpu
        if resume is not None and resume not in RESUME_MODES:
            fail(f"--resume {resume!r}: expected {' or '.join(RESUME_MODES)} (or no value: latest)")
        try:
            cfg = stages.resolve_stage_recipe(recipe, stage, list(overrides), on_gpu=on_gpu)
        except config.ConfigError as e:
            fail(str(e))
        note = stages.shadowed_recipe_note(recipe, stage)
        if note:
            typer.echo(note, err=True)

        resolved_path = Path(cfg.train.out_dir) / config.RESOLVED_RECIPE
        entry_args = ["--config", str(resolved_path)] + (["--resume", resume] if resume else [])
        try:
            sizes = cluster_env.resolve_launch(gpus, nodes=nodes, gpus_per_node=gpus_per_node, node_rank=node_rank,
                                               master_addr=master_addr, allow_placeholder_head=dry_run)
            plan = topology.plan_from_args(
                gpus, sizes.nodes,
                gpus_per_node=sizes.gpus_per_node,
                tp_size=cfg.engine.tensor_parallel_size if on_gpu else 1,
                colocate=cfg.engine.colocate,
                engine_gpus=engine_gpus,
                weight_transfer=cfg.engine.weight_transfer,
                redis_url=redis_url,
                master_addr=sizes.master_addr,
                master_port=master_port,
                recipe_args=tuple(entry_args),
                prompts_per_step=cfg.train.prompts_per_step,
                rollouts_per_prompt=cfg.rollouts_per_prompt,
                cpu_ranks=cpu,
            )
        except topology.PlanError as e:
            fail(str(e))
        gpu, cpu_refusal = None, None
        if on_gpu:
            try:
                gpu = gpu_card.resolve_gpu_memory(gpu_memory, dry_run=dry_run)
            except gpu_card.MemoryPlanError as e:
                fail(str(e))
            auto_tokens = cfg.train.micro_batch_tokens == "auto"
            cfg = engine_sizing.size_engines(cfg, plan, gpu.gib)   # the engines' "auto" fields, from the memory plan
            cfg = engine_sizing.size_micro_batch(cfg, plan, gpu.gib)
            spec = engine_sizing.memory_spec_for(cfg, plan, gpu.gib, gpu.name)
            plan = dataclasses.replace(plan, memory=memory_plan.build_memory_plan(spec))
            plan = dataclasses.replace(plan, notes=plan.notes + ((gpu.note,) if gpu.note else ()) + (
                (plan_view.micro_batch_note(plan.memory),) if auto_tokens else ()))
        elif cpu:                        # a rehearsal of the GPU launch on CPU (hosts/cpu_ranks.py)
            plan = dataclasses.replace(plan, notes=plan.notes + (
                f"{CPU_RANKS_ENV}=1: {gpus} CPU ranks ({sizes.nodes} node(s) x {gpus // sizes.nodes}) in a gloo "
                f"group, one engine on vLLM's CPU build per node, no GPU memory plan",))
        else:                            # a paper stage on CPU: say what that means, refuse what cannot fit
            try:
                shape, source = model_shape.shape_for_model(cfg.model.path)
            except (KeyError, TypeError, ValueError):   # not a Qwen3-style config.json: checks.rl_recipe says more
                shape = None
            if shape is not None:
                cpu_line, cpu_fits = memory_plan.cpu_training_line(shape, source, memory_plan.host_memory_gib())
                plan = dataclasses.replace(plan, notes=plan.notes + (cpu_line,))
                if not cpu_fits and (Path(cfg.model.path) / "config.json").is_file():   # known, not assumed
                    cpu_refusal = cpu_line
        if plan.launch_mode == "torchrun":   # torchrun forwards SIGUSR1 too and waits for the checkpoint
            extra = tuple(torchrun_env(cfg.train.preempt_grace_s).items())
            plan = dataclasses.replace(plan, nodes=tuple(dataclasses.replace(n, env=n.env + extra)
                                                         for n in plan.nodes))
        plan = dataclasses.replace(plan, notes=plan.notes + (stages.start_text(cfg),))
        if sizes.head_is_placeholder:
            plan = dataclasses.replace(plan, notes=plan.notes + (
                f"head node: {sizes.master_addr} is a placeholder (no --master-addr, not under SLURM); "
                f"give --master-addr, or run under SLURM, to launch",))
        k = cfg.train.max_staleness
        if k:
            where = ("their own GPUs" if on_gpu else "vLLM's engine-core process, beside the trainer on the same cores")
            plan = dataclasses.replace(plan, notes=plan.notes + (
                f"experimental: batches roll out up to {k} step(s) ahead on the engines ({where}); "
                f"weight updates pause them between requests",))

        if dry_run and not resolved_path.is_file():   # the node commands read it; a dry run writes nothing
            argv = [a for a in sys.argv[1:] if a != "--dry-run"]
            plan = dataclasses.replace(plan, notes=plan.notes + (
                f"the commands below read {resolved_path}, which this dry run does not write: "
                f"`{shlex.join(['rstar2', *argv])}` writes it and starts this node's "
                f"command (give --node-rank N, or run it under SLURM, on each node)",))
        problems = plan.memory.problems if plan.memory else ()
        if dry_run:
            console.rule(f"resolved recipe: {cfg.name} (stage {cfg.stage})")
            console.print(Syntax(config.dump_recipe(cfg), "yaml"))
            console.print(plan_view.render_plan(plan))
        if cpu_refusal:                  # its fp32 state exceeds this machine's memory: it would not load
            fail(cpu_refusal)
        if problems:                     # it would run out of memory at its first update or wake: refuse now
            fail(f"memory: {problems[0]}" + ("" if dry_run else " (rstar2 rl ... --dry-run shows the table)"))
        if dry_run:
            return
        if gpu is not None and gpu.note:  # a launch prints no plan: the card it assumed, or the option it left aside
            console.print(gpu.note)
        if plan.launch_mode == "direct" or len(plan.nodes) == 1 or sizes.node_rank is not None:
            checks.rl_recipe(cfg)        # this machine trains: the recipe's paths must be here
            # A folder holding a run is continued (--resume) or left alone. Every node of a multi-node
            # launch passes this at once: steps start only once all have joined the rendezvous.
            if (refused := run_folder.refusal(cfg.train.out_dir, resume)) is not None:
                fail(refused)
            try:                         # the checkpoint --resume takes is there and whole, before torchrun
                resume_point(cfg.train.out_dir, resume)
            except ResumeError as e:
                fail(str(e))

        run_folder.write_resolved_recipe(cfg)
        code = launch_entry.launch(plan, cfg, resume=resume, console=console, node_rank=sizes.node_rank)
        if code == PREEMPTED_EXIT_CODE:
            typer.echo(f"continue with: {continue_command(sys.argv[1:])}", err=True)
        raise typer.Exit(code)
