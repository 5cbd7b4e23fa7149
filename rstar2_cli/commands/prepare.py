"""`rstar2 prepare ...`: build training data (RL math set, SFT conversions).

Each subcommand parses flags and calls one core function in `rstar2_cli.data`; add a new one
with `@prepare_app.command("name")`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from rstar2_cli.commands import checks, fail, shown

prepare_app = typer.Typer(help="Prepare datasets: the RL math set, SFT conversions, eval sets.", no_args_is_help=True)


@prepare_app.command("math")
def math_command(
    source: list[str] = typer.Option(
        [], "--source", "-s",
        help="Input: file (.jsonl/.json/.parquet; .jsonl/.json may be gzip-compressed), named set "
             "(dapo_math_17k) or hub id, "
             "optionally ':LICENSE' (e.g. dapo_math_17k:Apache-2.0). Repeatable."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output .jsonl or .parquet."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="YAML spec (sources with field names, settings)."),
    eval_set: list[str] = typer.Option([], "--eval-set", help="Eval set to decontaminate against (repeatable; "
                                                               "default aime24 aime25 math500 hmmt25)."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Directory of <name>.jsonl sets "
                                                                     "(default $RSTAR2_DATA_DIR; the eval "
                                                                     "sets ship with rstar2)."),
    integer_only: bool = typer.Option(True, "--integer-only/--no-integer-only", help="Keep integer answers only."),
    near_dup_threshold: float = typer.Option(0.9, "--near-dup-threshold", help="MinHash Jaccard threshold."),
    ngram: int = typer.Option(8, "--ngram", min=1, help="Word n-gram size for decontamination."),
    boilerplate_min_problems: int = typer.Option(
        10, "--boilerplate-min-problems", min=0,
        help="Ignore eval n-grams found in this many training problems (0 = plain n-gram rule)."),
    no_hub: bool = typer.Option(False, "--no-hub", help="Never download from the Hugging Face hub."),
) -> None:
    """Build the integer-answer RL math set: clean, filter, dedup, decontaminate, with provenance."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rstar2_cli.config import first_error  # lazy: pydantic and the core, for --help's speed (cli.py)
    # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.data.prepare_math import PrepareMathConfig, SourceSpec, prepare_math, provenance_path, stats_table
    from rstar2_cli.data.problems import DataError  # lazy: pydantic and the core, for --help's speed (cli.py)

    if spec is not None:
        checks.input_file(spec, "--spec")
    settings = dict(eval_sets=eval_set or None, data_dir=data_dir, integer_only=integer_only,
                    near_dup_threshold=near_dup_threshold, ngram=ngram,
                    boilerplate_min_problems=boilerplate_min_problems, allow_hub=not no_hub)
    try:
        if spec is not None:
            extra = {"out": out, "sources": [SourceSpec.parse(s) for s in source] or None}
            config = PrepareMathConfig.from_yaml(spec, **extra, **settings)
        else:
            if not source or out is None:
                fail("give --source ... and --out (or --spec sources.yaml)")
            config = PrepareMathConfig(sources=[SourceSpec.parse(s) for s in source], out=out,
                                       **{k: v for k, v in settings.items() if v is not None})
    except ValidationError as e:
        fail(str(first_error(e, "prepare math")))
    except DataError as e:
        fail(str(e))
    checks.output_file(config.out, "--out")
    for src in config.sources:
        checks.problem_source(src.path, "--source", config.data_dir, hub_ids=True, allow_hub=config.allow_hub)
    for name in config.eval_sets:
        checks.problem_source(name, "--eval-set", config.data_dir, allow_hub=config.allow_hub)

    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        try:
            report = prepare_math(config, progress=progress)
        except DataError as e:
            fail(str(e))
    console.print(stats_table(report))
    console.print(f"wrote {config.out} ({report.kept:,} problems), provenance {provenance_path(config.out)}")


@prepare_app.command("sft")
def sft_command(
    in_path: Path = typer.Argument(..., help="Input .jsonl/.json/.parquet (.jsonl/.json may be gzip-compressed)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output .jsonl in rstar2 messages format."),
    fmt: str = typer.Option(..., "--format", "-f",
                            help="Input format: openai, sharegpt, glaive, toolace, apigen_mt."),
    show_errors: int = typer.Option(10, "--show-errors", min=0, help="How many skipped-row reasons to print."),
) -> None:
    """Convert a function-calling / chat dataset to rstar2's SFT messages format."""
    from rich.console import Console

    from rstar2_cli.data.problems import DataError  # lazy: pydantic and the core, for --help's speed (cli.py)
    # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.data.sft_convert import FORMATS, convert_file

    checks.data_file(in_path, "IN_PATH")
    checks.choice(fmt, FORMATS, "--format")
    checks.output_file(out, "--out")
    try:
        stats = convert_file(in_path, out, fmt)
    except DataError as e:
        fail(str(e))
    console = Console()
    for line in stats.errors[:show_errors]:
        console.print(f"[yellow]skipped[/] {line}", markup=True, highlight=False)
    if len(stats.errors) > show_errors:
        console.print(f"... and {len(stats.errors) - show_errors} more skipped rows")
    summary = {"rows": stats.rows, "converted": stats.converted, "skipped": stats.skipped}
    out.with_name(out.name + ".stats.json").write_text(json.dumps({**summary, "errors": stats.errors}, indent=2))
    console.print(f"converted {stats.converted:,}/{stats.rows:,} rows to {out} (skipped {stats.skipped:,})")


# `prepare hard`'s rollout flags: the RolloutConfig field each one sets
ROLLOUT_FLAGS = {"max_turns": "--max-turns", "max_response_tokens": "--max-tokens", "temperature": "--temperature",
                 "top_p": "--top-p"}
FROM_RECIPE = "default: the recipe's"


@prepare_app.command("hard")
def hard_command(
    policy: str = typer.Option(..., "--policy", help="The stage-2 checkpoint (HF folder) that rolls out."),
    recipe: Optional[str] = typer.Option(
        None, "--recipe",
        help="The RL recipe (file, or a packaged name: stage2) whose settings the rollouts take (default: the "
             "resolved_recipe.yaml of the run the policy's folder sits in)."),
    data: Optional[str] = typer.Option(None, "--data", help="The RL problem set to mine (file or named set; "
                                                            "default: the recipe's data.train)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The hard subset (.jsonl; default: where the "
                                                                 "stage-3 recipe reads it, its data.train)."),
    samples: int = typer.Option(8, "--samples", min=1, help="Rollouts per problem; kept if not all solved."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help=f"{FROM_RECIPE} rollout.temperature"),
    top_p: Optional[float] = typer.Option(None, "--top-p", help=f"{FROM_RECIPE} rollout.top_p"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help=f"{FROM_RECIPE} rollout.max_response_tokens"),
    max_turns: Optional[int] = typer.Option(None, "--max-turns", help=f"{FROM_RECIPE} rollout.max_turns"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Only the first N problems."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", envvar="RSTAR2_DATA_DIR"),
    sandbox_url: Optional[str] = typer.Option(
        None, "--sandbox-url", help="A running serve-sandbox (default: embedded)."
    ),
    seed: int = typer.Option(0, "--seed"),
    tp: Optional[int] = typer.Option(
        None,
        "--tp",
        min=1,
        help="GPUs per vLLM replica (default: the smallest that "
        "holds the policy); one replica per TP GPUs this process sees",
    ),
) -> None:
    """Stage-3 hard subset: problems the policy does not solve in all of its samples (with pass rates).

    The rollouts take the settings of the RL run that trained the policy (its resolved recipe: turns,
    tokens, sampling, tool protocol, grader, problems); a flag given replaces the recipe's value."""
    from pydantic import ValidationError

    # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.config import RESOLVED_RECIPE, ConfigError
    from rstar2_cli.data.problems import DataError  # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.eval.report import engines_line  # lazy: pydantic and the core, for --help's speed (cli.py)
    # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.prepare.mine_hard import mine_hard, mining_settings, run_recipe_of, stage3_problems
    from rstar2_cli.rl.run.stages import find_recipe  # lazy: pydantic and the core, for --help's speed (cli.py)

    checks.model_dir(policy, "--policy")
    out = out if out is not None else Path(stage3_problems())
    checks.output_file(out, "--out")
    if data is not None:
        checks.problem_source(data, "--data", data_dir)
    if sandbox_url is not None:
        checks.url(sandbox_url, "--sandbox-url")
    given = {field: (value, ROLLOUT_FLAGS[field]) for field, value in
             zip(ROLLOUT_FLAGS, (max_turns, max_tokens, temperature, top_p)) if value is not None}
    try:
        source = find_recipe(recipe) if recipe is not None else run_recipe_of(policy)
        if source is None and len(given) < len(ROLLOUT_FLAGS):
            missing = ", ".join(flag for field, flag in ROLLOUT_FLAGS.items() if field not in given)
            fail(f"--policy {shown(policy)}: no {RESOLVED_RECIPE} in it or any folder above it (the RL run that "
                 f"trained it writes one in its train.out_dir) to take the rollout settings from; give --recipe "
                 f"FILE, or {missing}")
        settings = mining_settings(source, {**given, **({"data": (data, "--data")} if data is not None else {})})
    except ConfigError as e:
        fail(str(e))
    except ValidationError as e:
        err = e.errors()[0]
        fail(f"{ROLLOUT_FLAGS[err['loc'][0]]} {shown(err['input'])}: {err['msg']}")
    if data is None:
        checks.problem_source(settings.data, f"{source}: data.train", data_dir)
    typer.echo(settings.line())
    try:
        summary = mine_hard(policy, out, settings, samples=samples, data_dir=data_dir, limit=limit, seed=seed,
                            sandbox_url=sandbox_url, tp=tp)
    except DataError as e:
        fail(str(e))
    except ValueError as e:          # the replicas cannot be placed (launch/eval_engines.py)
        fail(f"--policy {policy}: {e}")
    typer.echo(engines_line(summary["engines"]))
    typer.echo(f"kept {summary['hard']:,} of {summary['problems']:,} problems not solved {samples}/{samples} "
               f"-> {out} (pass rates in {out}.pass_rates.json)")


@prepare_app.command("eval-data")
def eval_data_command(
    gpqa: Optional[Path] = typer.Option(None, "--gpqa", help="GPQA-Diamond: the release's gpqa_diamond.csv, or a "
                                        ".jsonl/.json/.parquet with the Hub's columns (Record ID, Question, "
                                        "Correct Answer, Incorrect Answer 1..3)."),
    ifeval: Optional[Path] = typer.Option(None, "--ifeval", help="IFEval: input_data.jsonl (key, prompt, "
                                          "instruction_id_list, kwargs), or a .json/.parquet export."),
    from_hub: bool = typer.Option(False, "--from-hub", help="Take the sets not given as files from the local "
                                  "Hugging Face datasets cache (offline; nothing is downloaded)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", envvar="RSTAR2_DATA_DIR",
                                       help="Folder to write gpqa_diamond.jsonl / ifeval.jsonl into; pass it to "
                                            "`rstar2 eval --data-dir` (default $RSTAR2_DATA_DIR)."),
) -> None:
    """Validate GPQA-Diamond / IFEval and write them where `rstar2 eval` reads them."""
    from rstar2_cli.data.problems import DataError  # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.eval.eval_data import prepare_eval_data  # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.eval.reference import MissingExtraError  # lazy: pydantic and the core, for --help's speed (cli.py)

    if gpqa is None and ifeval is None and not from_hub:
        fail("give --gpqa FILE and/or --ifeval FILE (or --from-hub to read the Hugging Face datasets cache)")
    if out is None:
        fail("--out: give the folder to write into (or set $RSTAR2_DATA_DIR)")
    for path, flag in ((gpqa, "--gpqa"), (ifeval, "--ifeval")):
        if path is not None:
            checks.data_file(path, flag)
    checks.output_dir(out, "--out")
    try:
        done = prepare_eval_data(out, {"gpqa_diamond": gpqa, "ifeval": ifeval}, from_hub)
    except (DataError, MissingExtraError) as e:
        fail(str(e))
    for d in done:
        typer.echo(f"{d['set']}: not written: {d['skipped']}" if "skipped" in d
                   else f"{d['set']}: wrote {d['rows']} rows{d['note']} -> {d['path']}")
    typer.echo(f"now: rstar2 eval all CKPT --data-dir {out}")


def register(app: typer.Typer) -> None:
    app.add_typer(prepare_app, name="prepare")
