"""What a generation engine takes and gives: `GenRequest` (token ids in), `GenResult` (sampled ids
and their logprobs out) and the `Engine` interface every replica implements (`engines.VLLMEngine`,
`openai_engine.OpenAIEngine`); `sampling_params` builds vLLM's request from a GenRequest and
`to_result` converts vLLM's `CompletionOutput`. Why token ids in and out: engines.py.

Per-request seeds (`rollout.seed_requests`, resolved by `seeds_requests`). The agent loop gives
every turn a seed of its own (agent_loop.trajectory_seed); a VLLMEngine forwards it to vLLM only
where the recipe says so, "auto" meaning on CPU. What a seed costs in vLLM 0.32 on GPU:
* V1 model runner (the one a colocated, sleeping RL engine runs: engine_env.py): a seeded request
  gets its own `torch.Generator` (vllm/v1/worker/gpu_model_runner.py, RANDOM_SEED requests; the
  `generators` dict of vllm/v1/worker/gpu_input_batch.py), and every decode step then draws its
  noise one sequence at a time, one kernel launch per seeded sequence
  (vllm/v1/sample/ops/topk_topp_sampler.py `random_sample`), and falls back from FlashInfer's
  top-k/top-p sampler to the PyTorch one (`forward_cuda`).
* V2 model runner (engines alone on their GPUs: eval): seeds go into one batched Gumbel kernel
  (vllm/v1/worker/gpu/sample/gumbel.py), but a batch holding an explicitly seeded request is not
  eligible for the fused FlashInfer top-k/top-p sampler (vllm/v1/worker/gpu/sample/sampler.py,
  `any_explicit_seed`): eval's top_p 0.95 then sorts the vocabulary instead.
Without request seeds the engine's own seed (`AsyncEngineArgs.seed`, one per replica) drives the
sampler (`set_random_seed` in vllm/v1/worker/gpu_worker.py; V2 draws each request's seed from
numpy's global generator on arrival, v1/worker/gpu/sample/states.py): a sample then depends on
which replica ran the request and in what order, so a rerun is a fresh draw from the same policy
rather than the same tokens. On a GPU the tokens also depend on the batch a request shared
(reduction order changes with batch shape), so request seeds never made GPU runs bitwise
repeatable; on CPU they do, and the quickstart, determinism and resume tests rely on it. The
release sends none either (J-shang/verl agent_loop.py: temperature, top_p, repetition_penalty and
max_new_tokens to its SGLang servers).
"""
from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


class EngineRequestError(RuntimeError):
    """An engine failed one request through no fault of the caller (a remote server's error
    answer or lost connection): the trajectory is an engine fault, not a bug."""


def is_engine_failure(e: BaseException) -> bool:
    """Whether `e` is an engine's own failure of a request: `EngineRequestError`, or vLLM's
    server-side errors (`vllm.exceptions.VLLMServerError`: `AsyncLLM.generate` raises
    `EngineGenerateError` for a failed request and `EngineDeadError` for a dead core,
    vllm/v1/engine/async_llm.py). Anything else out of a rollout is a bug and propagates. vLLM is
    looked up only if loaded: an error cannot be vLLM's when vLLM was never imported (it takes
    seconds to import)."""
    if isinstance(e, EngineRequestError):
        return True
    vllm_errors = sys.modules.get("vllm.exceptions")
    return vllm_errors is not None and isinstance(e, vllm_errors.VLLMServerError)


@dataclass
class GenRequest:
    prompt_ids: list[int]            # full context so far (prompt + previous turns + tool responses)
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = True            # return the sampled token's logprob per generated token
    ignore_eos: bool = False         # benchmarks: force exactly max_tokens tokens
    priority: int = 0                # vLLM request priority (lower first; needs scheduling_policy="priority")

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("GenRequest.prompt_ids: must not be empty")
        if self.max_tokens < 1:
            raise ValueError(f"GenRequest.max_tokens: must be >= 1 (got {self.max_tokens})")


@dataclass
class GenResult:
    token_ids: list[int]             # generated ids, including the stop token if one was hit
    logprobs: list[float]            # same length as token_ids ([] when the request had logprobs=False)
    finish_reason: str               # "stop" (stop token / eos) | "length"
    stop_token_id: int | None        # which stop token ended it, if any
    policy_version: int = 0          # the weights that generated its first token (engine.weights_version)
    # partial rollouts (pause mode "keep"): (first index in token_ids, version) per run of tokens
    # sampled by one version, from vLLM's own per-output weight-version spans; [] = all policy_version
    version_spans: list[tuple[int, int]] = field(default_factory=list)


@runtime_checkable
class Engine(Protocol):
    """One generation replica. `kv_capacity_tokens` lets a scheduler turn in-flight token counts
    into a fraction of this replica's KV cache."""

    kv_capacity_tokens: int

    async def generate(self, req: GenRequest) -> GenResult: ...
    def kv_free_fraction(self) -> float: ...
    async def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None: ...
    async def reset_prefix_cache(self) -> None: ...
    async def close(self) -> None: ...


def seeds_requests(setting: bool | str, *, on_cpu: bool) -> bool:
    """Whether an engine forwards each request's seed to vLLM: `rollout.seed_requests` ("auto": on
    CPU only, module docstring)."""
    return on_cpu if setting == "auto" else bool(setting)


def sampling_params(req: GenRequest, *, max_model_len: int, seeded: bool) -> Any:
    """vLLM's `SamplingParams` for `req` on an engine of context `max_model_len`: token ids out
    (no detokenizing, stop by id), the final output only, `req.seed` only when `seeded`. The
    budget is cut to what the prompt leaves; a prompt that leaves nothing is the request's
    EngineRequestError."""
    from vllm import SamplingParams  # lazy: vLLM: imported only where it runs
    from vllm.sampling_params import RequestOutputKind  # lazy: vLLM: imported only where it runs

    room = max_model_len - len(req.prompt_ids)
    if room < 1:
        # the request's failure, not a bug: a long problem plus earlier turns fill the context
        raise EngineRequestError(f"prompt of {len(req.prompt_ids)} tokens leaves no room in "
                                 f"max_model_len={max_model_len}")
    return SamplingParams(
        n=1, max_tokens=min(req.max_tokens, room), temperature=req.temperature,
        top_p=req.top_p, stop_token_ids=list(req.stop_token_ids), seed=req.seed if seeded else None,
        logprobs=0 if req.logprobs else None, detokenize=False, ignore_eos=req.ignore_eos,
        skip_special_tokens=False, output_kind=RequestOutputKind.FINAL_ONLY,
    )


def version_spans(spans: Any, version: int) -> list[tuple[int, int]]:
    """vLLM's `CompletionOutput.weight_versions` ([start, end) per label, the label the engine core
    held when it sampled them: `update_weight_version`) as (start, version) runs. A label that is
    not a number is vLLM's "default" (no update labelled yet): the version the request started on."""
    out: list[tuple[int, int]] = []
    for span in spans or ():
        if span.end <= span.start:
            continue
        v = int(span.version) if str(span.version).isdigit() else version
        if not out or out[-1][1] != v:
            out.append((int(span.start), v))
    return out


def to_result(out: Any, want_logprobs: bool, version: int = 0, spans: bool = False) -> GenResult:
    """vLLM `CompletionOutput` -> GenResult (sampled-token logprobs, stop token identified;
    `spans`: the per-token weight versions too)."""
    ids = list(out.token_ids)
    logprobs: list[float] = []
    if want_logprobs:
        logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs, ids)]
    finish = "stop" if out.finish_reason == "stop" else "length"
    stop_id = out.stop_reason if isinstance(out.stop_reason, int) else None
    if finish == "stop" and stop_id is None and ids:
        stop_id = ids[-1]            # EOS: vLLM reports stop_reason=None, the id is the last token
    runs = version_spans(getattr(out, "weight_versions", None), version) if spans else []
    return GenResult(token_ids=ids, logprobs=logprobs, finish_reason=finish, stop_token_id=stop_id,
                     policy_version=runs[0][1] if runs else version, version_spans=runs)
