"""The SFT loss mask, token by token: only assistant text (+ its <|im_end|>) is trained, the token
layout is the RL agent loop's, and TRL's collator (padded or packed) keeps labels aligned."""
from __future__ import annotations

import pytest
import torch
from sft_rows import ADD_TOOL, eight_rows, tool_conversation
from transformers import AutoTokenizer

from rstar2_cli.protocol.responses import tool_turn_ids
from rstar2_cli.models.attention import flash_attention_available
from rstar2_cli.protocol.template import encode_messages, install_chat_template, render_messages
from rstar2_cli.sft.masks import MaskError, conversation_ids_and_mask
from rstar2_cli.sft.settings import SftConfig
from rstar2_cli.sft.trainer import build_sft_trainer


@pytest.fixture(scope="module")
def tok(tiny_model):
    return install_chat_template(AutoTokenizer.from_pretrained(tiny_model))


def trained_spans(tok, ids, mask) -> list[str]:
    spans, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            spans.append(tok.decode(cur)); cur = []
    if cur:
        spans.append(tok.decode(cur))
    return spans


def test_only_assistant_turns_and_their_im_end_are_trained(tok):
    conv = {"messages": [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3 and 4 + 5?"},
        {"role": "assistant", "content": "Let me add.",
         "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                        {"name": "add", "arguments": {"a": 4, "b": 5}}]},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "9"},
        {"role": "assistant", "content": "They are 5 and 9."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ], "tools": [ADD_TOOL]}
    ids, mask = conversation_ids_and_mask(tok, conv["messages"], conv["tools"])
    assert len(ids) == len(mask)
    assert trained_spans(tok, ids, mask) == [
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
        '\n<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call><|im_end|>',
        "They are 5 and 9.<|im_end|>",
        "You're welcome.<|im_end|>",
    ]
    # Everything else (system + tools, user turns, tool responses, assistant headers) is context.
    assert tok.decode(ids) == render_messages(tok, conv["messages"], conv["tools"])
    untrained = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert untrained.count("<|im_start|>assistant\n<reason>") == 3   # the release's forced <reason>: context
    assert "<tool_response>\n5\n</tool_response>\n<tool_response>\n9\n</tool_response>" in untrained
    assert "You add numbers." in untrained and '"name": "add"' in untrained  # the tools block


def test_token_layout_is_the_rl_agent_loops(tok):
    """RL trajectory = prompt ids + generated ids + tool-turn ids + generated ids: SFT must match it."""
    conv = tool_conversation(2, 3)
    msgs, tools = conv["messages"], conv["tools"]
    ids, mask = conversation_ids_and_mask(tok, msgs, tools)
    prompt = encode_messages(tok, msgs[:2], tools, add_generation_prompt=True)
    turn1 = tok.encode('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>',
                       add_special_tokens=False)
    tool_turn = tool_turn_ids(tok, ["5"])
    turn2 = tok.encode("The answer is 5.<|im_end|>", add_special_tokens=False)
    tail = tok.encode("\n", add_special_tokens=False)
    assert ids == prompt + turn1 + tool_turn + turn2 + tail
    assert mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(tool_turn) + [1] * len(turn2) + [0] * len(tail)
    assert ids == encode_messages(tok, msgs, tools)   # and identical to rendering the whole conversation


def test_force_reason_false_matches_an_rl_recipe_without_it(tok):
    conv = tool_conversation(2, 3)
    msgs, tools = conv["messages"], conv["tools"]
    ids, mask = conversation_ids_and_mask(tok, msgs, tools, force_reason=False)
    assert "<reason>" not in tok.decode(ids)
    prompt = encode_messages(tok, msgs[:2], tools, add_generation_prompt=True, force_reason=False)
    assert ids[:len(prompt)] == prompt and mask[len(prompt)] == 1
    assert tool_turn_ids(tok, ["5"], force_reason=False) == tok.encode(
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False)


def test_assistant_text_starting_with_newline_keeps_its_own_tokens(tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\nhello"}]
    ids, mask = conversation_ids_and_mask(tok, msgs)
    assert trained_spans(tok, ids, mask) == ["\n\nhello<|im_end|>"]
    assert tok.decode(ids) == render_messages(tok, msgs)


def test_a_conversation_without_assistant_turn_is_refused(tok):
    with pytest.raises(MaskError, match="no assistant message"):
        conversation_ids_and_mask(tok, [{"role": "user", "content": "hi"}])


def _expected_labels(dataset_rows):
    return {tuple(ids): [t if m else -100 for t, m in zip(ids, mask)] for ids, mask in dataset_rows}


@pytest.mark.parametrize("packing", [False, True])
def test_trl_collator_labels_are_minus_100_exactly_where_the_mask_is_0(tiny_model, sft_file, tmp_path, packing):
    cfg = SftConfig(model=str(tiny_model), data=[str(sft_file)], out_dir=str(tmp_path / "run"), max_steps=1,
                    batch_size=4, per_device_batch_size=4, max_length=1024, packing=packing,
                    gradient_checkpointing=False)
    trainer, info = build_sft_trainer(cfg)
    tok = trainer.processing_class
    rows = eight_rows()
    expected = _expected_labels(conversation_ids_and_mask(tok, r["messages"], r.get("tools")) for r in rows)
    assert info["examples"] == 8
    seen = 0
    for batch in trainer.get_train_dataloader():
        ids, labels = batch["input_ids"].cpu(), batch["labels"].cpu()
        if info["packing"]:   # one flat row; documents start where position_ids restart at 0
            assert ids.shape[0] == 1 and "attention_mask" not in batch
            pos = batch["position_ids"][0].cpu()
            starts = (pos == 0).nonzero().flatten().tolist() + [ids.shape[1]]
            docs = [(ids[0, s:e], labels[0, s:e]) for s, e in zip(starts, starts[1:])]
        else:
            docs = [(ids[r][batch["attention_mask"][r].bool()], labels[r][batch["attention_mask"][r].bool()])
                    for r in range(ids.shape[0])]
        for doc_ids, doc_labels in docs:
            want = expected[tuple(doc_ids.tolist())]
            assert doc_labels.tolist() == want
            seen += 1
    assert seen == 8


def test_packing_under_sdpa_trains_padded_batches_not_a_dense_packed_row(tiny_model, sft_file, tmp_path):
    """Without flash-attn a packed row would attend through a dense T x T mask: padded batches instead."""
    cfg = SftConfig(model=str(tiny_model), data=[str(sft_file)], out_dir=str(tmp_path / "run"), max_steps=1,
                    batch_size=8, per_device_batch_size=8, max_length=4096, packing=True, gradient_checkpointing=False,
                    attn_implementation="sdpa")
    trainer, info = build_sft_trainer(cfg)
    assert info["packing"] is False and info["attention"] == "sdpa"
    assert trainer.model.config._attn_implementation == "sdpa"
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 8 and "attention_mask" in batch     # one document per row


@pytest.mark.skipif(not flash_attention_available(), reason="packing runs only with flash-attn on CUDA/ROCm")
def test_packed_batch_gives_the_same_logits_as_separate_documents(tiny_model, sft_file, tmp_path):
    """Packing must not let a document attend to its neighbour (position ids restart per document)."""
    cfg = SftConfig(model=str(tiny_model), data=[str(sft_file)], out_dir=str(tmp_path / "run"), max_steps=1,
                    batch_size=8, per_device_batch_size=8, max_length=4096, packing=True, gradient_checkpointing=False,
                    dtype="bfloat16")
    trainer, info = build_sft_trainer(cfg)
    assert info["packing"] is True and info["attention"] == "flash_attention_2"
    model = trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))
    pos = batch["position_ids"][0]
    starts = (pos == 0).nonzero().flatten().tolist() + [pos.numel()]
    assert len(starts) - 1 >= 2, "the test needs at least two documents in one packed row"
    ids, pos = batch["input_ids"].to(model.device), batch["position_ids"].to(model.device)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos).logits[0].float()
        for s, e in zip(starts, starts[1:]):
            alone = model(input_ids=ids[:, s:e]).logits[0].float()
            torch.testing.assert_close(packed[s:e], alone, atol=3e-2, rtol=3e-2)     # bf16
