"""Evaluation settings: the paper's protocol as defaults, validated at construction.

rStar2-Agent reports avg@16 pass@1 at temperature 0.6, up to 30K response tokens and up to 30
turns. The official eval scripts set neither the temperature nor the turn limit, so the protocol
lives here, once, and every run writes the full resolved settings next to its results.

The prompt and tool protocol defaults to the release's (RolloutConfig's defaults): evaluating the
released checkpoint sends it exactly the bytes it was trained on. `protocol` takes the protocol
fields of the RL recipe a checkpoint was trained with (config.PROTOCOL_FIELDS), when they differ.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar2_cli.config import PROTOCOL_FIELDS, RolloutConfig, Temperature, TopP, load_recipe
from rstar2_cli.eval.benchmarks import BENCHMARKS
from rstar2_cli.eval.protocol_defaults import EVAL_DEFAULTS as D
from rstar2_cli.models.checkpoint_config import checkpoint_config
from rstar2_cli.rollout.engine_args import default_max_model_len


# vLLM (config/model.py, _get_and_verify_max_len) leaves max_position_embeddings as it is for
# these RoPE types and multiplies it by rope_scaling.factor for the others.
_ROPE_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def model_context_limit(model: str) -> int | None:
    """The longest context a checkpoint accepts, as vLLM derives it from config.json:
    `max_position_embeddings` (or the text config's), times the RoPE scaling factor where vLLM
    applies one; None when the folder (or cached Hub repo) has no such config."""
    cfg = checkpoint_config(model)
    if cfg is None:
        return None
    limit = cfg.get("max_position_embeddings")
    if not isinstance(limit, int):
        return None
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) not in (
        None,
        "default",
        *_ROPE_ALREADY_SCALED,
    ):
        limit = int(limit * float(rope.get("factor") or 1.0))
    return limit


def context_length(s: "EvalSettings") -> int:
    """The engine's context: `--max-model-len` when given, else the response budget plus the
    prompt's room, capped at the model's own limit (the engine then shortens each request's
    budget to what its prompt leaves)."""
    if s.max_model_len:
        return s.max_model_len
    want = default_max_model_len(s.max_tokens)
    limit = model_context_limit(s.model)
    return min(want, limit) if limit else want


def protocol_of_rollout(rollout: RolloutConfig) -> dict[str, Any]:
    """`system_prompt`, `tools_in_prompt` and `protocol` (EvalSettings fields) as a recipe's
    rollout section sets them: an eval then sends what that RL run's policy was trained on."""
    return {"system_prompt": rollout.system_prompt, "tools_in_prompt": rollout.tools_in_prompt,
            "protocol": {f: getattr(rollout, f) for f in PROTOCOL_FIELDS}}


def rollout_fields(rollout: RolloutConfig) -> dict[str, Any]:
    """The EvalSettings fields that roll out as a recipe's rollout section does: its turns, response
    tokens, sampling and request seeds, and its protocol (`protocol_of_rollout`)."""
    return {"max_turns": rollout.max_turns, "max_tokens": rollout.max_response_tokens,
            "temperature": rollout.temperature, "top_p": rollout.top_p, "seed_requests": rollout.seed_requests,
            **protocol_of_rollout(rollout)}


def protocol_of_recipe(path: str) -> dict[str, Any]:
    """`protocol_of_rollout` of the RL recipe at `path` (ConfigError naming the file if it is not
    a valid recipe)."""
    return protocol_of_rollout(load_recipe(path).rollout)


class EvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    benchmark: str                                   # eval.benchmarks.BENCHMARKS, or custom with `data`
    model: str                                       # checkpoint folder, or the served model name
    data: str | None = None                          # a jsonl with id, problem, answer (custom set)
    data_dir: str | None = None                      # folder of <set>.jsonl; wins over the shipped sets
    out_dir: str | None = None
    samples: int = Field(D["samples"], ge=1)         # k in avg@k (defaults: eval/protocol_defaults.py)
    temperature: Temperature = D["temperature"]      # bounds: config.Temperature / TopP, as a recipe's
    top_p: TopP = D["top_p"]
    max_tokens: int = Field(D["max_tokens"], ge=1)   # response budget, tool tokens included
    max_turns: int = Field(D["max_turns"], ge=1)
    limit: int | None = Field(None, ge=1)            # only the first N problems
    seed: int = D["seed"]
    answer_mode: Literal["outcome", "strict_answer_tag", "last_boxed"] = D["answer_mode"]   # as reward.mode
    system_prompt: str | None = None                 # as the RL recipe's rollout.system_prompt
    tools_in_prompt: bool = D["tools_in_prompt"]     # as rollout.tools_in_prompt
    use_tools: bool = D["use_tools"]                 # False (--no-tools): no tool schema and one turn, so
                                                     # the answer comes from reasoning alone
    protocol: dict[str, Any] = Field(default_factory=dict)   # rollout.<field> of the RL recipe, for
                                                     # the fields in config.PROTOCOL_FIELDS; {}: the release's
    engine: Literal["vllm", "openai"] = D["engine"]
    base_url: str | None = None                      # for --engine openai
    tokenizer: str | None = None                     # for --engine openai (default: model)
    sandbox_url: str | None = None                   # remote sandbox; None = embedded pool
    max_model_len: int | None = None
    # the vLLM replicas (launch/eval_engines.py plans them for the commands): each group's node-local
    # GPU ids, tensor_parallel_size of them; None: one replica on the default device
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_groups: list[list[int]] | None = None
    seed_requests: Literal["auto", True, False] = D["seed_requests"]  # as rollout.seed_requests
    cpu_kvcache_space_gb: int = Field(1, ge=1)
    grade_timeout: float = Field(5.0, gt=0.0)
    progress: bool = True

    @classmethod
    def default_of(cls, field: str) -> Any:
        """The default of `field`: the one place the evaluation protocol's values are written (the
        `rstar2 eval` options show and use these)."""
        return cls.model_fields[field].get_default(call_default_factory=True)

    def rollout_config(self) -> RolloutConfig:
        """The agent loop's settings for this evaluation."""
        return RolloutConfig(max_turns=self.max_turns if self.use_tools else 1, max_response_tokens=self.max_tokens,
                             temperature=self.temperature, top_p=self.top_p, system_prompt=self.system_prompt,
                             tools_in_prompt=self.tools_in_prompt and self.use_tools, **self.protocol)

    @model_validator(mode="after")
    def _check(self) -> "EvalSettings":
        unknown = sorted(set(self.protocol) - set(PROTOCOL_FIELDS))
        if unknown:
            raise ValueError(
                f"protocol: {unknown[0]!r} is not a protocol field; use one of {', '.join(PROTOCOL_FIELDS)}"
            )
        self.rollout_config()      # a bad protocol value fails here, naming the field
        self._check_groups()
        if self.engine == "openai" and not self.base_url:
            raise ValueError("--engine openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        if self.benchmark not in BENCHMARKS and not self.data:
            raise ValueError(
                f"unknown benchmark {self.benchmark!r}: use one of {', '.join(BENCHMARKS)} or --data FILE"
            )
        return self

    def _check_groups(self) -> None:
        seen: set[int] = set()
        for group in self.gpu_groups or []:
            if len(group) != self.tensor_parallel_size:
                raise ValueError(f"gpu_groups: {group} has {len(group)} GPU id{'s' * (len(group) != 1)}, not "
                                 f"tensor_parallel_size={self.tensor_parallel_size}")
            for gpu in group:
                if gpu < 0 or gpu in seen:
                    raise ValueError(f"gpu_groups: GPU {gpu} " + ("appears twice" if gpu in seen else "is negative"))
                seen.add(gpu)
