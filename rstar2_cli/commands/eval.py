"""`rstar2 eval SET CKPT`: the paper's evaluation protocol on a benchmark or a custom set;
`rstar2 eval all CKPT`: the paper's table (eval/paper_table.py); `--compare CKPT2`: A against B."""
from __future__ import annotations

from typing import Optional

import typer

from typing import TYPE_CHECKING

from rstar2_cli.commands import checks, fail
from rstar2_cli.eval.protocol_defaults import default_of as DEFAULT   # each option's default is the protocol's

if TYPE_CHECKING:
    from rstar2_cli.eval.settings import EvalSettings


def replicas_for(settings, tp: Optional[int]) -> dict:
    """The EvalSettings fields that place `settings.model`'s vLLM replicas on the visible GPUs
    (launch/eval_engines.py); says the plan in one line, or fails with one."""
    from rstar2_cli.eval.settings import context_length  # lazy: pydantic and the core, for --help's speed (cli.py)
    # lazy: pydantic and the core, for --help's speed (cli.py)
    from rstar2_cli.launch.eval_engines import eval_engines_for

    try:
        plan = eval_engines_for(settings.model, context_length(settings), tp)
    except ValueError as e:
        fail(f"{settings.model}: {e}")
    typer.echo(f"engines for {settings.model}: {plan.why}", err=True)
    return plan.settings()


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_cmd(
        benchmark: str = typer.Argument(
            ...,
            help="aime24 | aime25 | math500 | hmmt25 | gpqa_diamond | ifeval | bfcl | all (the paper's table) | "
            "custom (with --data)",
        ),
        model: str = typer.Argument(
            ..., help="checkpoint folder (HF format), or the served model name with --engine openai"
        ),
        data: Optional[str] = typer.Option(
            None,
            "--data",
            help="the set's rows from a file (math: id, problem, answer; gpqa_diamond, ifeval, bfcl: their Hub / "
            "package columns); without it a benchmark name is read from the data dir, never from a path in the "
            "working directory",
        ),
        data_dir: Optional[str] = typer.Option(
            None,
            "--data-dir",
            envvar="RSTAR2_DATA_DIR",
            help="folder holding <set>.jsonl (as `rstar2 prepare eval-data --out` writes it); a file there "
            "wins over the copies of aime24, aime25, math500 and hmmt25 shipped with rstar2",
        ),
        out: Optional[str] = typer.Option(
            None, "--out", help="output folder (default runs/eval/SET-MODEL); reruns resume"
        ),
        samples: int = typer.Option(DEFAULT("samples"), "--samples", help="samples per problem (avg@k)"),
        temperature: float = typer.Option(DEFAULT("temperature"), "--temperature"),
        top_p: float = typer.Option(DEFAULT("top_p"), "--top-p"),
        max_tokens: int = typer.Option(
            DEFAULT("max_tokens"), "--max-tokens", help="response budget, tool tokens included"
        ),
        max_turns: int = typer.Option(DEFAULT("max_turns"), "--max-turns"),
        limit: Optional[int] = typer.Option(None, "--limit", help="only the first N problems"),
        seed: int = typer.Option(DEFAULT("seed"), "--seed"),
        answer_mode: str = typer.Option(
            DEFAULT("answer_mode"),
            "--answer-mode",
            help="outcome: the last \\boxed{} (as reward.mode); strict_answer_tag: needs <answer>; last_boxed",
        ),
        engine: str = typer.Option(
            DEFAULT("engine"), "--engine", help="vllm (local) | openai (any OpenAI-compatible server)"
        ),
        base_url: Optional[str] = typer.Option(
            None, "--base-url", help="with --engine openai, e.g. http://127.0.0.1:8000/v1"
        ),
        tokenizer: Optional[str] = typer.Option(
            None, "--tokenizer", help="tokenizer folder for --engine openai (default: MODEL)"
        ),
        sandbox_url: Optional[str] = typer.Option(
            None, "--sandbox-url", help="a running rstar2 serve-sandbox (default: embedded pool)"
        ),
        max_model_len: Optional[int] = typer.Option(
            None,
            "--max-model-len",
            help="engine context (default: --max-tokens + 2048, capped at the model's max_position_embeddings)",
        ),
        system_prompt: Optional[str] = typer.Option(
            None,
            "--system-prompt",
            help="replace the release's system prompt (as the RL recipe's rollout.system_prompt)",
        ),
        tools_in_prompt: bool = typer.Option(
            DEFAULT("tools_in_prompt"),
            "--tools-in-prompt/--no-tools-in-prompt",
            help="list the tool schema in the prompt (release: yes)",
        ),
        use_tools: bool = typer.Option(
            DEFAULT("use_tools"), "--tools/--no-tools", help="--no-tools: no tool schema and one turn (reasoning only)"
        ),
        compare: Optional[str] = typer.Option(
            None,
            "--compare",
            help="a second checkpoint: both run, and the report gives A - B with a 95 % interval per benchmark",
        ),
        protocol_from: Optional[str] = typer.Option(
            None,
            "--protocol-from",
            help="an RL recipe: take its prompt and tool protocol (rollout.system_prompt, tools_in_prompt, response "
            "texts, ...) for a checkpoint trained with it; default: the release's (--system-prompt still overrides)",
        ),
        tp: Optional[int] = typer.Option(
            None,
            "--tp",
            min=1,
            help="GPUs per vLLM replica (default: the smallest that holds the model); "
            "one replica per TP GPUs this process sees (CUDA_VISIBLE_DEVICES)",
        ),
        seed_requests: str = typer.Option(
            DEFAULT("seed_requests"),
            "--seed-requests",
            help="a sampling seed on every request: auto (on CPU only) | true | false "
            "(as rollout.seed_requests; docs/eval.md)",
        ),
    ) -> None:
        """Evaluate a checkpoint with tool-integrated generation: avg@k pass@1, pass@k, maj@k, lengths, tool stats."""
        from pydantic import ValidationError

        # lazy: pydantic and the core, for --help's speed (cli.py)
        from rstar2_cli.config import ConfigError, first_error
        # lazy: pydantic and the core, for --help's speed (cli.py)
        from rstar2_cli.eval.settings import BENCHMARKS, EvalSettings, protocol_of_recipe

        layout = {"system_prompt": system_prompt, "tools_in_prompt": tools_in_prompt}
        if protocol_from:
            try:
                layout = protocol_of_recipe(protocol_from)
            except ConfigError as e:
                fail(str(e))
            layout["system_prompt"] = system_prompt if system_prompt is not None else layout["system_prompt"]

        if tp is not None and engine != "vllm":
            fail(f"--tp {tp}: only with --engine vllm (a served model's parallelism is the server's)")
        placements: dict[str, dict] = {}      # per checkpoint: the replicas (launch/eval_engines.py)

        def settings_for(bench: str, ckpt: str, out_dir: Optional[str], check: bool = False,
                         check_data: bool = True) -> EvalSettings:
            try:
                settings = EvalSettings(
                    benchmark=bench,
                    model=ckpt, data=data, data_dir=data_dir, out_dir=out_dir, samples=samples,
                    temperature=temperature, top_p=top_p, max_tokens=max_tokens, max_turns=max_turns,
                    limit=limit, seed=seed, answer_mode=answer_mode, engine=engine, base_url=base_url,
                    tokenizer=tokenizer, sandbox_url=sandbox_url, max_model_len=max_model_len,
                    use_tools=use_tools, seed_requests={"true": True, "false": False}.get(seed_requests, seed_requests),
                    **layout,
                )
            except ValidationError as e:
                fail(str(first_error(e, "eval")))
            if check:
                checks.eval_settings(settings, data=check_data)
            if engine == "vllm":
                if ckpt not in placements:
                    placements[ckpt] = replicas_for(settings, tp)
                settings = EvalSettings(**{**settings.model_dump(), **placements[ckpt]})
            return settings

        from rstar2_cli.data.problems import DataError  # lazy: pydantic and the core, for --help's speed (cli.py)
        # lazy: pydantic and the core, for --help's speed (cli.py)
        from rstar2_cli.eval.reference import MissingExtraError
        from rstar2_cli.eval.runner import run_eval  # lazy: pydantic and the core, for --help's speed (cli.py)

        if benchmark == "all" and data:
            fail("--data names one benchmark's file; `eval all` reads every set from --data-dir")
        benches = BENCHMARKS if benchmark == "all" else [benchmark]
        no_data: dict[str, str] = {}
        for bench in benches:   # every setting is checked before anything runs
            settings_for(bench, model, out, check=True, check_data=benchmark != "all")
            if compare:
                settings_for(bench, compare, out, check=True, check_data=benchmark != "all")
            if benchmark == "all" and (reason := checks.eval_data_missing(bench, data_dir)):
                no_data[bench] = reason     # listed in its row with how to add it; the rest run
        try:
            if benchmark != "all" and not compare:
                run_eval(settings_for(benchmark, model, out))
                return
            # lazy: pydantic and the core, for --help's speed (cli.py)
            from rstar2_cli.eval.paper_table import MD_FILE, default_table_dir, evaluate_table

            root = default_table_dir(benchmark, model, out)
            evaluate_table(settings_for, model, root, benches, compare, with_left_out=benchmark == "all",
                           no_data=no_data)
            typer.echo((root / MD_FILE).read_text())
        except (DataError, MissingExtraError) as e:
            fail(str(e))
