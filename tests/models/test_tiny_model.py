"""The tiny Qwen3 builder: a loadable, deterministic HF folder with our tokenizer and template."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from rstar2_cli.models.tiny import build_tiny_model
from rstar2_cli.protocol import chat_template, eos_token_ids

PROMPT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_folder_has_config_weights_tokenizer_and_eos_ids(tiny_dir):
    from transformers import AutoTokenizer
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    vocab = tok.get_vocab()
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]] == eos_token_ids(tok)
    assert tok.chat_template == chat_template()
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["head_dim"] == 32
    assert cfg["vocab_size"] == len(tok)   # every id the model can sample decodes


def test_protocol_tags_are_single_tokens_and_any_text_round_trips(tiny_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    for tag in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<tool_response>",
                "</tool_response>", "<reason>", "</reason>", "<answer>", "</answer>"]:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    text = (
        "<reason>x² − 1 = 0 ⇒ x = ±1; 中文 🙂 \t\r\n</reason>\n<tool_call>\n{\"code\": \"print(12345)\"}\n</tool_call>"
    )
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
    # like Qwen3: the tool tags survive skip_special_tokens, the ChatML markers do not
    assert (
        tok.decode(tok.encode("<tool_call>1</tool_call><|im_end|>"), skip_special_tokens=True)
        == "<tool_call>1</tool_call>"
    )


def test_reloads_and_generates_with_transformers(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False)])
    new = model.generate(ids, max_new_tokens=6, do_sample=True)[0, ids.shape[1]:].tolist()
    assert 1 <= len(new) <= 6 and all(0 <= i < len(tok) for i in new)
    assert isinstance(tok.decode(new), str)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_dir):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()


@pytest.mark.parametrize("kwargs, match", [({"head_dim": 48}, "head_dim must be one of"),
                                           ({"num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads"),
                                           ({"vocab_size": 100}, "vocab_size must be >=")])
def test_bad_sizes_are_rejected(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_tiny_model(tmp_path / "m", **kwargs)


VLLM_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from vllm import LLM, SamplingParams
    from transformers import AutoModelForCausalLM
    path, prompt = sys.argv[1], sys.argv[2]
    llm = LLM(model=path, enforce_eager=True, dtype="float32", max_model_len=256, seed=0)
    ids = llm.get_tokenizer().encode(prompt, add_special_tokens=False)
    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=4, temperature=1.0, seed=0, logprobs=0))
    gen = out[0].outputs[0]
    vllm_lps = [d[t].logprob for t, d in zip(gen.token_ids, gen.logprobs)]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids + list(gen.token_ids)])).logits[0, len(ids) - 1:-1]
    hf_lps = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0].tolist()
    print("RESULT " + json.dumps({"ids": list(gen.token_ids), "vllm": vllm_lps, "hf": hf_lps}))
""")


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_loads_the_tiny_model_and_agrees_with_transformers(tiny_dir):
    pytest.importorskip("vllm")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    # a subprocess: vLLM's engine state and thread settings must not leak into the test session
    proc = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, str(tiny_dir), PROMPT], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT "):])
    assert len(res["ids"]) == 4
    assert res["vllm"] == pytest.approx(res["hf"], abs=1e-3)   # the engine samples what the trainer scores
