"""`rstar2 sft`: TRL's SFTTrainer on conversations rendered with the RL chat template.

The dataset is tokenized here (ids + assistant masks from `masks.py`) and handed to TRL
pre-tokenized, so SFT and RL see identical token layouts and TRL only builds labels (-100 where
the mask is 0), batches, packs (`packing: true`, best-fit-decreasing, padding-free with per-document
position ids) and trains.

Packing needs flash-attn: a packed row reaches the model as `position_ids` with no mask, which
`flash_attention_2` turns into variable-length sequences (`cu_seqlens`), but for which SDPA gets a
dense block-diagonal `[1, 1, T, T]` mask from transformers and computes all T^2 blocks (the RL
update's layouts, rl/update/packing.py, have the figures). So `packing: true` is honoured only where
`attn_implementation` resolves to `flash_attention_2` (rstar2_cli/models/attention.py); under SDPA the
conversations are batched with padding instead (padding-only masks, no cross-document blocks),
with a warning, and `info["packing"]` says which ran.

LoRA goes through PEFT; with `lora.merge` the saved adapter is merged
into a fresh copy of the base model on the main process and saved as a plain HF folder
(`out_dir/final`) that vLLM serves, so merging works the same after FSDP training.

Precision: on GPU, full fine-tuning keeps fp32 master weights and trains under bf16 autocast
(`dtype: auto`; at lr 5e-6 pure-bf16 weights would round most updates away); LoRA loads the
frozen base in bf16. `dtype: bfloat16` forces pure bf16. CPU trains in fp32.

Multi-GPU (FSDP2 through accelerate; the per-device batch and accumulation adapt to WORLD_SIZE
so the global batch stays `batch_size`):

    torchrun --nproc-per-node 8 $(which rstar2) sft rstar2_cli/recipes/sft.yaml --set fsdp=true
    # or: accelerate launch --num_processes 8 -m rstar2_cli.cli sft rstar2_cli/recipes/sft.yaml --set fsdp=true

With `fsdp: true` gradient checkpointing becomes FSDP activation checkpointing, each decoder layer
is one FSDP unit, weights are loaded on rank 0 only (`cpu_ram_efficient_loading`) and checkpoints
are gathered to full HF state dicts.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import SFTConfig, SFTTrainer

from rstar2_cli.models.attention import choose_attention, flash_attention_available
from rstar2_cli.protocol.template import install_chat_template
from rstar2_cli.sft.data import SftDataError, load_conversations, tokenize_conversations
from rstar2_cli.sft.settings import SftConfig

__all__ = ["SftDataError", "build_sft_trainer", "merge_lora", "run_sft"]


class RichProgress(TrainerCallback):
    """A TrainerCallback drawing a rich progress bar with the running loss (main process only)."""
    bar: Progress | None = None

    def on_train_begin(self, args, state, control, **kw):
        if state.is_world_process_zero:
            self.bar = Progress(TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
            self.bar.start()
            self.task = self.bar.add_task("sft", total=state.max_steps, info="")

    def on_log(self, args, state, control, logs=None, **kw):
        if self.bar is not None and logs and "loss" in logs:
            self.bar.update(self.task, info=f"loss {float(logs['loss']):.4f}")

    def on_step_end(self, args, state, control, **kw):
        if self.bar is not None:
            self.bar.update(self.task, completed=state.global_step)

    def on_train_end(self, args, state, control, **kw):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _precision(cfg: SftConfig, on_gpu: bool):
    """(dtype to load the weights in, bf16 autocast on/off)."""
    if cfg.dtype == "float32" or not on_gpu:
        return torch.float32, False
    if cfg.dtype == "bfloat16" or cfg.lora.r > 0:
        return torch.bfloat16, True
    return torch.float32, True              # auto, full fine-tuning: fp32 master weights, bf16 autocast


def _training_args(cfg: SftConfig, *, on_gpu: bool, bf16: bool, world: int):
    accum = max(1, cfg.batch_size // (cfg.per_device_batch_size * world))
    fsdp: dict[str, Any] = {}
    if cfg.fsdp:
        # what `accelerate launch --use_fsdp` exports: lets from_pretrained load weights on rank 0 only
        os.environ.setdefault("ACCELERATE_USE_FSDP", "true")
        fsdp = dict(fsdp=True, fsdp_config={
            "version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "cpu_ram_efficient_loading": True,
            "state_dict_type": "FULL_STATE_DICT", "activation_checkpointing": cfg.gradient_checkpointing})
    return SFTConfig(
        output_dir=cfg.out_dir, num_train_epochs=cfg.epochs, max_steps=cfg.max_steps,
        learning_rate=cfg.lr, warmup_steps=cfg.warmup_ratio, lr_scheduler_type=cfg.lr_scheduler,
        per_device_train_batch_size=cfg.per_device_batch_size, gradient_accumulation_steps=accum,
        max_length=cfg.max_length, packing=cfg.packing, packing_strategy="bfd",
        gradient_checkpointing=cfg.gradient_checkpointing and not cfg.fsdp,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        bf16=bf16, seed=cfg.seed, logging_steps=cfg.logging_steps, save_strategy="steps",
        save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit, weight_decay=cfg.weight_decay,
        ddp_find_unused_parameters=False, report_to=[], disable_tqdm=True, use_cpu=not on_gpu,
        dataset_num_proc=None, **fsdp,
    )


def build_sft_trainer(cfg: SftConfig, *, progress: bool = False):
    """(SFTTrainer ready to `.train()`, info dict with examples / dropped / effective batch)."""
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    main = int(os.environ.get("RANK", "0")) == 0
    rows = load_conversations(cfg.data)
    tokenizer = install_chat_template(AutoTokenizer.from_pretrained(cfg.model))
    # tokenize before CUDA / torch.distributed start: large sets fork worker processes
    dataset, dropped = tokenize_conversations(tokenizer, rows, cfg.max_length, progress=progress and main,
                                              force_reason=cfg.force_reason)
    on_gpu = torch.cuda.is_available()
    dtype, bf16 = _precision(cfg, on_gpu)
    attention = choose_attention(cfg.attn_implementation, "cuda" if on_gpu else "cpu",
                                 torch.bfloat16 if bf16 else dtype, on_gpu and flash_attention_available())
    packing = cfg.packing and attention.layout == "packed"
    if main and cfg.packing and not packing:
        Console(stderr=True).print(
            f"[yellow]warning[/]: packing: true needs flash_attention_2 (under sdpa a packed "
            f"row attends through a dense T x T mask); training padded batches: {attention.reason}"
        )
    args = _training_args(cfg.model_copy(update={"packing": packing}), on_gpu=on_gpu, bf16=bf16,
                          world=world)   # first: it sets up torch.distributed
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype, attn_implementation=attention.implementation)
    peft_config = None
    if cfg.lora.r > 0:
        from peft import LoraConfig  # lazy: peft (~4 s to import), for LoRA only

        peft_config = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                 target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    if progress:
        trainer.remove_callback(PrinterCallback)     # the rich bar shows the loss instead of raw dicts
        trainer.add_callback(RichProgress())
    info = {"examples": len(dataset), "dropped": dropped, "packing": packing, "attention": attention.implementation,
            "global_batch": cfg.per_device_batch_size * args.gradient_accumulation_steps * world}
    if main and info["global_batch"] != cfg.batch_size:
        Console(stderr=True).print(f"[yellow]warning[/]: batch_size {cfg.batch_size} is not a multiple of "
                                   f"per_device_batch_size x {world} processes; training with {info['global_batch']}")
    if main and dropped:
        Console(stderr=True).print(f"[yellow]warning[/]: {dropped} conversations have no assistant token within "
                                   f"max_length={cfg.max_length}; skipped")
    return trainer, info


def merge_lora(base_model: str, adapter_dir: str | Path, out_dir: str | Path, dtype=None) -> Path:
    """Merge a saved PEFT adapter into a fresh copy of the base model; save a plain HF folder."""
    from peft import PeftModel  # lazy: peft (~4 s to import), for LoRA only

    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype or "auto")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
    return Path(out_dir)


def run_sft(cfg: SftConfig, *, progress: bool = True) -> dict[str, Any]:
    """Train, save `out_dir/final` as a plain HF folder, and return the training summary."""
    out = Path(cfg.out_dir)
    trainer, info = build_sft_trainer(cfg, progress=progress)
    result = trainer.train()
    final = out / "final"
    lora = cfg.lora.r > 0
    if lora:
        adapter_dir = out / "adapter"
        trainer.save_model(str(adapter_dir))             # gathers the adapter under FSDP too
        trainer.accelerator.wait_for_everyone()
        if cfg.lora.merge and trainer.is_world_process_zero():
            dtype, _ = _precision(cfg, trainer.args.device.type == "cuda")
            merge_lora(cfg.model, adapter_dir, final, dtype=dtype)
    else:
        trainer.save_model(str(final))                   # full state dict, written by the main process
    if trainer.is_world_process_zero() and (final / "config.json").is_file():
        trainer.processing_class.save_pretrained(final)  # with our chat template installed
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    summary = {
        "final_checkpoint": str(final) if (not lora or cfg.lora.merge) else str(out / "adapter"),
        "examples": info["examples"], "dropped_too_long": info["dropped"], "global_batch": info["global_batch"],
        "packing": info["packing"], "attention": info["attention"],
        "steps": trainer.state.global_step, "train_loss": result.training_loss,
        "first_logged_loss": losses[0] if losses else None, "last_logged_loss": losses[-1] if losses else None,
        "lora": lora, "settings": cfg.model_dump(mode="json"),
    }
    if trainer.is_world_process_zero():
        (out / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    trainer.accelerator.wait_for_everyone()
    return summary
