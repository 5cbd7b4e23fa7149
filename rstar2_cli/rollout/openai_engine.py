"""A remote OpenAI-compatible server behind the `Engine` interface, for evaluating baselines served
elsewhere (token-id prompts in, sampled ids and logprobs out, as with `VLLMEngine`)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rstar2_cli.rollout.generation import GenRequest, GenResult
from rstar2_cli.rollout.generation import EngineRequestError

if TYPE_CHECKING:
    import torch


class OpenAIEngine:
    """`generate` through an OpenAI-compatible `/v1/completions` server that accepts token-id
    prompts and vLLM's extensions (`stop_token_ids`, `return_token_ids`) — for evaluating
    baselines served elsewhere. It cannot see the server's KV cache or change its weights."""

    kv_capacity_tokens = 0

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout: float = 600.0, transport: Any = None):
        import httpx

        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIEngine base_url: expected http(s)://..., got {base_url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                         timeout=timeout, transport=transport)

    def payload(self, req: GenRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(req.prompt_ids), "max_tokens": req.max_tokens,
            "temperature": req.temperature, "top_p": req.top_p,
            "stop_token_ids": list(req.stop_token_ids), "ignore_eos": req.ignore_eos,
            "skip_special_tokens": False, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "logprobs": 0 if req.logprobs else None,
        }
        if req.seed is not None:
            body["seed"] = req.seed
        return body

    @staticmethod
    def parse_choice(choice: dict[str, Any], want_logprobs: bool) -> GenResult:
        ids = choice.get("token_ids")
        lp = choice.get("logprobs") or {}
        if ids is None:      # servers without return_token_ids: tokens come as "token_id:N"
            tokens = lp.get("tokens") or []
            if not tokens or not all(str(t).startswith("token_id:") for t in tokens):
                raise ValueError("OpenAIEngine: server returned neither token_ids nor "
                                 "token_id:N logprob tokens; it must be vLLM-compatible")
            ids = [int(str(t).split(":", 1)[1]) for t in tokens]
        logprobs = [float(x) for x in lp.get("token_logprobs") or []] if want_logprobs else []
        if want_logprobs and len(logprobs) != len(ids):
            raise ValueError(f"OpenAIEngine: {len(logprobs)} logprobs for {len(ids)} tokens")
        finish = "stop" if choice.get("finish_reason") == "stop" else "length"
        stop = choice.get("stop_reason")
        stop_id = stop if isinstance(stop, int) else (ids[-1] if finish == "stop" and ids else None)
        return GenResult(token_ids=list(ids), logprobs=logprobs, finish_reason=finish,
                         stop_token_id=stop_id)

    async def generate(self, req: GenRequest) -> GenResult:
        import httpx

        try:
            resp = await self._client.post("/v1/completions", json=self.payload(req))
        except httpx.HTTPError as e:      # a lost connection or a timeout: the server's failure
            raise EngineRequestError(f"OpenAIEngine: {type(e).__name__}: {e}") from e
        if resp.status_code != 200:
            raise EngineRequestError(f"OpenAIEngine: {resp.request.url} answered {resp.status_code}: "
                               f"{resp.text[:300]}")
        return self.parse_choice(resp.json()["choices"][0], req.logprobs)

    def kv_free_fraction(self) -> float:
        return 1.0

    async def update_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        raise RuntimeError("OpenAIEngine serves a remote model; its weights cannot be updated "
                           "from here (use VLLMEngine for training rollouts)")

    async def reset_prefix_cache(self) -> None:
        return None

    async def close(self) -> None:
        await self._client.aclose()
