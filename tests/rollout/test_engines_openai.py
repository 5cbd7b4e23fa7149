"""OpenAIEngine: token-id prompts out, sampled ids + logprobs back, against a mocked
OpenAI-compatible /v1/completions server (vLLM's response shape)."""
from __future__ import annotations

import json

import httpx
import pytest

from rstar2_cli.rollout.engines import Engine, GenRequest
from rstar2_cli.rollout.openai_engine import OpenAIEngine


def server(choice: dict, seen: list, status: int = 200):
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        if status != 200:
            return httpx.Response(status, text="model overloaded")
        return httpx.Response(200, json={"choices": [choice]})
    return httpx.MockTransport(handle)


async def test_request_carries_token_ids_and_result_keeps_sampled_ids():
    seen: list = []
    choice = {"text": "x", "token_ids": [5, 9, 42], "finish_reason": "stop", "stop_reason": 42,
              "logprobs": {"tokens": ["a", "b", "c"], "token_logprobs": [-0.1, -0.2, -0.3]}}
    eng = OpenAIEngine("http://eval-host:8000", "qwen", transport=server(choice, seen))
    out = await eng.generate(GenRequest([1, 2, 3], max_tokens=8, temperature=0.6, top_p=0.95,
                                        stop_token_ids=[7, 42], seed=3))
    path, body = seen[0]
    assert path == "/v1/completions"
    assert body["prompt"] == [1, 2, 3] and body["model"] == "qwen" and body["max_tokens"] == 8
    assert body["stop_token_ids"] == [7, 42] and body["seed"] == 3 and body["logprobs"] == 0
    assert body["temperature"] == 0.6 and body["top_p"] == 0.95
    assert out.token_ids == [5, 9, 42] and out.logprobs == [-0.1, -0.2, -0.3]
    assert out.finish_reason == "stop" and out.stop_token_id == 42
    await eng.close()


async def test_ids_recovered_from_token_id_strings_when_server_omits_token_ids():
    choice = {"text": "", "finish_reason": "length", "stop_reason": None,
              "logprobs": {"tokens": ["token_id:11", "token_id:12"], "token_logprobs": [-1.0, -2.0]}}
    eng = OpenAIEngine("http://h", "m", transport=server(choice, []))
    out = await eng.generate(GenRequest([1], max_tokens=2))
    assert out.token_ids == [11, 12] and out.finish_reason == "length" and out.stop_token_id is None


async def test_eos_stop_reports_the_last_token_as_stop_id():
    choice = {"token_ids": [4, 0], "finish_reason": "stop", "stop_reason": None,
              "logprobs": {"token_logprobs": [-1.0, -0.5]}}
    eng = OpenAIEngine("http://h", "m", transport=server(choice, []))
    assert (await eng.generate(GenRequest([1], max_tokens=4))).stop_token_id == 0


async def test_server_error_and_incompatible_server_are_clear_errors():
    eng = OpenAIEngine("http://h", "m", transport=server({}, [], status=503))
    with pytest.raises(RuntimeError, match="503.*overloaded"):
        await eng.generate(GenRequest([1], max_tokens=4))
    plain = {"text": "hi", "finish_reason": "length", "logprobs": {"tokens": ["hi"], "token_logprobs": [-1.0]}}
    eng = OpenAIEngine("http://h", "m", transport=server(plain, []))
    with pytest.raises(ValueError, match="token_ids"):
        await eng.generate(GenRequest([1], max_tokens=4))


async def test_remote_engine_has_no_kv_view_and_no_weight_updates():
    eng = OpenAIEngine("http://h", "m")
    assert isinstance(eng, Engine)
    assert eng.kv_free_fraction() == 1.0
    with pytest.raises(RuntimeError, match="cannot be updated"):
        await eng.update_weights([])
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("h:8000", "m")


def test_bad_generation_requests_name_the_field():
    with pytest.raises(ValueError, match="prompt_ids"):
        GenRequest([], max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        GenRequest([1], max_tokens=0)
    # temperature and top-p are validated once, where they are read (config.Temperature, config.TopP)
