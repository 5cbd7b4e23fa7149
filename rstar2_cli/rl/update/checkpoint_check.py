"""Is a checkpoint whole? Every file's bytes against what its own header says it holds.

Why before loading: a checkpoint cut short (a disk that filled, a job killed mid-copy onto a shared
file system) is found by the loaders deep inside safetensors or torch.distributed.checkpoint, with
a traceback that names neither the folder nor the file. `damage` names the first file that is
short of what its header promises:
  - each `*.safetensors`: the 8-byte header length and JSON header must be there, and the file must
    reach the end of the last tensor's `data_offsets` (the safetensors format);
  - `state/.metadata` must read as DCP metadata (`FileSystemReader.read_metadata`), and every
    `.distcp` file must reach the end of each item stored in it (`storage_data`: offset + length).
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch.distributed.checkpoint as dcp

from rstar2_cli.rl.update.checkpoint import STATE_DIR


def _safetensors_damage(path: Path) -> str | None:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path}: cut off ({size} bytes, no safetensors header)"
        (n,) = struct.unpack("<Q", head)
        raw = f.read(n)
    if len(raw) < n:
        return f"{path}: cut off in its header ({size} of at least {8 + n} bytes)"
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"{path}: its safetensors header does not read ({e})"
    end = 8 + n + max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return f"{path}: cut off at {size:,} of {end:,} bytes" if size < end else None


def _state_damage(state: Path) -> str | None:
    try:
        metadata = dcp.FileSystemReader(str(state)).read_metadata()
    except Exception as e:    # any reason the metadata does not read is damage; the message names it
        return f"{state / '.metadata'}: does not read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        path = state / name
        if not path.is_file():
            return f"{path}: missing"
        if path.stat().st_size < end:
            return f"{path}: cut off at {path.stat().st_size:,} of {end:,} bytes"
    return None


def damage(step_dir: Path) -> str | None:
    """The first file of checkpoint folder `step_dir` that is missing or short (module docstring),
    as one line; None when every file holds what its header says."""
    for path in sorted(step_dir.glob("*.safetensors")):
        found = _safetensors_damage(path)
        if found:
            return found
    return _state_damage(step_dir / STATE_DIR)
