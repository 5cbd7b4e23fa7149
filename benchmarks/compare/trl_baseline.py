"""TRL's `GRPOTrainer` on the quickstart toy task, set up to do the same work as rstar2's RL step.

Why a separate module: `bench_vs_trl.py` compares whole training loops, and everything that is
TRL-specific (the tokenizer's response template, the tool as a Python function, the reward as a
TRL reward function, the GRPOConfig that mirrors our recipe, the step timers) lives here, so the
benchmark itself only schedules runs and reports.

What is made identical to rstar2 (see docs/benchmarks.md for what cannot be):
  * prompt tokens: the SFT checkpoint's own chat template, with the `<tools>` block left out as the
    toy recipe does (`rollout.tools_in_prompt: false`); TRL always passes `tools=` to the template,
    so the template given to TRL ignores it (`prompt_template`);
  * tool-call parsing: Hermes JSON in `<tool_call>`, which is TRL's Qwen3 response template;
  * the tool: `python_code_with_standard_io(code, input)`, its output formatted by the agent
    loop's `response_text` (stdout, then stderr, middle-cut to 512 characters);
  * the reward: `grade_batch` on the decoded completion (generated + tool tokens), as in RL.
"""
from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rstar2_cli.protocol.responses import response_text
from rstar2_cli.protocol.template import chat_template, problem_messages
from rstar2_cli.quickstart.settings import TOY_PROTOCOL
from rstar2_cli.reward import grade_batch

TOOL_NAME = "python_code_with_standard_io"
_TOOLS_BLOCK = "{%- if tools %}"
# After an assistant turn our template writes "\n" unless a tool turn follows (the release's RL
# layout). TRL requires a prefix-preserving template for tool use, else it swaps in its own (and the
# prompt ids would change); so under TRL a conversation's last assistant turn ends at <|im_end|>.
# Prompts hold no assistant turn, and TRL cuts tool suffixes at the EOS, so no id changes.
_AFTER_ASSISTANT = "{%- if loop.last or loop_messages[loop.index0 + 1].role != 'tool' %}\n            {{- '\\n' }}"
_AFTER_ASSISTANT_TRL = (
    "{%- if not loop.last and loop_messages[loop.index0 + 1].role != 'tool' %}\n            {{- '\\n' }}"
)


def prompt_template() -> str:
    """Our chat template without the `<tools>` block and with the toy protocol's `force_reason`
    fixed (TRL renders without our template variables): the toy recipe's prompt layout under TRL."""
    text = chat_template()
    for part in (_TOOLS_BLOCK, _AFTER_ASSISTANT):
        if text.count(part) != 1:
            raise RuntimeError(f"chat_template.jinja: expected one {part!r}, found {text.count(part)}")
    force = "true" if TOY_PROTOCOL["force_reason"] else "false"
    text = text.replace(_TOOLS_BLOCK, "{%- if false %}").replace(_AFTER_ASSISTANT, _AFTER_ASSISTANT_TRL)
    return "{%- set force_reason = " + force + " %}" + text


def trl_tokenizer(model_path: str):
    """The checkpoint's tokenizer with the toy prompt layout and TRL's Qwen3 (Hermes) response parser."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.chat_template = prompt_template()
    tok.response_template = copy.deepcopy(qwen3_template)
    return tok


@dataclass
class ToolClock:
    """Seconds spent inside tool calls and how many there were (TRL runs them one by one)."""
    seconds: float = 0.0
    calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
            self.calls += 1


class _Result:
    """The fields of a sandbox RunResult that `format_run_result` reads."""

    def __init__(self, stdout: str, stderr: str, reason: str, wall_time: float = 0.0) -> None:
        self.stdout, self.stderr, self.reason, self.wall_time = stdout, stderr, reason, wall_time


def as_trl_tool(run: Callable[[str, str], Any], clock: ToolClock, timeout: float,
                max_chars: int) -> Callable[..., str]:
    """The tool as TRL wants it (a typed function with a docstring TRL turns into a schema); `run`
    executes (code, stdin) and returns a RunResult-like object, formatted as the agent loop does."""
    def python_code_with_standard_io(code: str, input: str = "") -> str:
        """Execute Python code with standard input and capture standard output.

        Args:
            code: A string containing Python code to be executed.
            input: A string that will be provided as standard input to the code.
        """
        t = time.perf_counter()
        try:
            return response_text(run(code, input), max_chars, timeout, style=TOY_PROTOCOL["response_format"])
        finally:
            clock.add(time.perf_counter() - t)

    return python_code_with_standard_io


def sandbox_tool(box, clock: ToolClock, timeout: float, max_chars: int) -> Callable[..., str]:
    """The tool running code in our embedded sandbox (the same pool type and limits as RL)."""
    return as_trl_tool(lambda code, stdin: box.run_sync(code, stdin=stdin or None, timeout=timeout),
                       clock, timeout, max_chars)


def run_in_subprocess(code: str, stdin: str, timeout: float) -> _Result:
    """A fresh `python` per call via subprocess.run, as a TRL user writes it. The code goes to a
    file (not `-c`) so tracebacks quote the failing line, as the sandbox's do."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "main.py"
        path.write_text(code)
        try:
            p = subprocess.run([sys.executable, str(path)], input=stdin, capture_output=True, text=True,
                               timeout=timeout, cwd=d)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return _Result(out, "", "timeout")
    return _Result(p.stdout, p.stderr, "ok" if p.returncode == 0 else "runtime_error")


def subprocess_tool(clock: ToolClock, timeout: float, max_chars: int) -> Callable[..., str]:
    return as_trl_tool(lambda code, stdin: run_in_subprocess(code, stdin, timeout), clock, timeout, max_chars)


def toy_dataset(train_file: str | Path, system_prompt: str):
    """RL problems as a TRL conversational dataset: the agent loop's first-turn messages + answer."""
    import json

    from datasets import Dataset

    rows = [json.loads(line) for line in Path(train_file).read_text().splitlines() if line.strip()]
    return Dataset.from_list([{"prompt": problem_messages(r["problem"], system_prompt), "answer": str(r["answer"])}
                              for r in rows])


def outcome_reward(tokenizer, mode: str = "outcome", timeout: float = 5.0) -> Callable[..., list[float]]:
    """A TRL reward function: our binary outcome grader on the decoded completion tokens."""
    def toy_outcome_reward(prompts, completions, completion_ids, answer, **_: Any) -> list[float]:
        texts = [tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                 for ids in completion_ids]
        return [g.reward for g in grade_batch(list(zip(texts, answer)), timeout=timeout, mode=mode)]

    return toy_outcome_reward


@dataclass(frozen=True)
class TrlRunSpec:
    """The knobs shared with the rstar2 recipe (values come from the quickstart settings)."""
    steps: int
    prompts_per_step: int
    group_size: int
    lr: float
    max_response_tokens: int
    max_turns: int
    temperature: float
    seed: int
    use_vllm: bool
    micro_batches: int = 4           # gradient accumulation: one optimizer step per generation batch
    weight_decay: float = 0.0        # AdamW; bench_vs_trl passes the rstar2 recipe's


def grpo_config(spec: TrlRunSpec, out_dir: str | Path):
    """GRPOConfig as close to the rstar2 recipe as TRL allows (every remaining gap: docs/benchmarks.md)."""
    from trl import GRPOConfig

    completions = spec.prompts_per_step * spec.group_size
    if completions % spec.micro_batches:
        raise ValueError(
            f"prompts_per_step * group_size ({completions}) must divide into {spec.micro_batches} micro-batches"
        )
    return GRPOConfig(
        output_dir=str(out_dir),
        max_steps=spec.steps,
        seed=spec.seed,
        data_seed=spec.seed,
        per_device_train_batch_size=completions // spec.micro_batches,
        gradient_accumulation_steps=spec.micro_batches,
        num_generations=spec.group_size,
        num_iterations=1,  # one on-policy update per batch
        max_completion_length=spec.max_response_tokens,  # tool tokens count, as ours
        max_tool_calling_iterations=spec.max_turns - 1,  # max_turns generations
        temperature=spec.temperature,
        top_p=1.0,
        learning_rate=spec.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=spec.weight_decay,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",  # no KL, token-level, Clip-Higher
        use_vllm=spec.use_vllm,
        vllm_mode="colocate",
        vllm_max_model_length=512,
        vllm_importance_sampling_correction=False,  # ours: rollout TIS off
        use_cpu=True,
        bf16=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def reload_weights_in_place(generation) -> None:
    """TRL's colocated weight sync through vLLM's own in-place reload.

    TRL's `VLLMGeneration.sync_weights` calls `model.load_weights` on the engine's model. On a CPU
    with oneDNN (AVX-512, e.g. AMD EPYC), vLLM 0.32 packs every linear layer's weight after loading
    and replaces `layer.weight` with an empty Parameter that has no `weight_loader`
    (`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)` in
    vllm/model_executor/layers/utils.py), so the second load raises AttributeError. The model
    runner's `reload_weights(weights_iterator=...)` restores the layers, loads, and re-packs
    (vllm/model_executor/model_loader/reload/), the same layerwise path rstar2's engines use. The
    tensors and their names are TRL's own (`_iter_named_params`), so nothing else changes."""
    if generation.enable_sleep_mode:   # as TRL's own sync: weights must be mapped before loading
        generation.llm.wake_up(tags=["weights"])
        generation._llm_weights_sleeping = False
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    generation.llm.reset_prefix_cache()


def timed_trainer_class():
    """GRPOTrainer with generation and reward timers (tools are timed by their ToolClock), and
    colocated vLLM weight sync through vLLM's in-place reload (`reload_weights_in_place`)."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        generation_seconds = 0.0
        reward_seconds = 0.0

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            generation = getattr(self, "vllm_generation", None)
            if generation is not None and generation.mode == "colocate":
                generation.sync_weights = lambda: reload_weights_in_place(generation)

        def _generate_single_turn(self, *args, **kwargs):
            t = time.perf_counter()
            try:
                return super()._generate_single_turn(*args, **kwargs)
            finally:
                self.generation_seconds += time.perf_counter() - t

        def _calculate_rewards(self, *args, **kwargs):
            t = time.perf_counter()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                self.reward_seconds += time.perf_counter() - t

    return TimedGRPOTrainer
