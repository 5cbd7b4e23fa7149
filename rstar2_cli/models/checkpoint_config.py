"""A checkpoint's config.json as a mapping, from a model folder or a Hub repo already in the local
cache (nothing is downloaded): what eval reads for the context limit and the engine plan reads for
the model's sizes. Multimodal configs keep the language model's fields under `text_config`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def checkpoint_config(model: str) -> dict[str, Any] | None:
    """The language model's config.json fields of `model` (a folder, or a cached Hub repo id);
    None when there is no such file or it is not a JSON mapping."""
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache   # a Hub id: only what is cached

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:       # not a repo id
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):     # unreadable, not UTF-8, not JSON
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    return text if isinstance(text, dict) and text else config
