"""Length-prefixed JSON frames: the wire format between the host and the zygotes.

A 4-byte big-endian length then UTF-8 JSON. Compact, stdlib-only (the zygote side imports it
inside the jail) and robust to partial reads.
"""
from __future__ import annotations

import json
import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024


def encode(obj: dict) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


class FrameBuffer:
    """Accumulates bytes from a non-blocking pipe and yields complete frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
            if len(self._buf) < HEADER.size + size:
                break
            frames.append(json.loads(bytes(self._buf[HEADER.size:HEADER.size + size])))
            del self._buf[:HEADER.size + size]
        return frames


async def read_frame(reader) -> dict:
    """Read one frame from an asyncio StreamReader (raises IncompleteReadError at EOF)."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME}")
    return json.loads(await reader.readexactly(size))
