"""Frames between the host and its zygotes: a 4-byte big-endian size, a kind byte, then the body.

Why not JSON: after every fork, each page the zygote writes is a copy-on-write fault, so the
zygote's per-call Python work is paid again in page faults (measured on a light zygote:
json.loads + json.dumps ~100 faults per call, marshal ~25), and every module the zygote imports
makes each fork and exit dearer. Hence:
  * requests (host -> zygote) are `marshal`ed dicts; that direction is trusted (the host wrote it);
  * answers and the ready frame (zygote -> host) are fixed struct headers (plus the raw
    stdout/stderr bytes), so the host never unmarshals anything produced inside the jail.
"""
from __future__ import annotations

import marshal
import struct

HEADER = struct.Struct(">IB")  # size of the body, kind
READY_BODY = struct.Struct(">QI")  # the zygote's VM size after preloading, its slots
ANSWER = struct.Struct(">QidBII")  # call id, exit code (-1: none), wall time, reason, len(stdout), len(stderr)
MAX_FRAME = 64 * 1024 * 1024
READY, REQUEST, ANSWER_KIND = 0, 1, 2
REASONS = ("ok", "runtime_error", "timeout", "memory", "output_limit", "internal_error")
# What a light zygote may also answer: the call imported a module only the full tier has, so the
# pool runs it again there (sandbox.core.tiers). Never a RunResult reason: the host consumes it.
REROUTE = "reroute"
WIRE_REASONS = REASONS + (REROUTE,)


def encode_ready(base_vm: int, slots: int) -> bytes:
    return HEADER.pack(READY_BODY.size, READY) + READY_BODY.pack(base_vm, slots)


def encode_request(obj: dict) -> bytes:
    body = marshal.dumps(obj)
    return HEADER.pack(len(body), REQUEST) + body


def encode_answer(call_id: int, exit_code: int | None, wall: float, reason: str, out: bytes, err: bytes) -> bytes:
    head = ANSWER.pack(
        call_id, -1 if exit_code is None else exit_code, wall, WIRE_REASONS.index(reason), len(out), len(err)
    )
    return HEADER.pack(len(head) + len(out) + len(err), ANSWER_KIND) + head + out + err


def decode_answer(body: bytes) -> dict:
    call_id, code, wall, reason, n_out, n_err = ANSWER.unpack_from(body)
    start = ANSWER.size
    if start + n_out + n_err != len(body) or reason >= len(WIRE_REASONS):
        raise ValueError("malformed answer frame")
    return {"id": call_id, "exit_code": None if code < 0 else code, "wall_time": round(wall, 6),
            "reason": WIRE_REASONS[reason], "stdout": body[start:start + n_out].decode(errors="replace"),
            "stderr": body[start + n_out:].decode(errors="replace")}


class FrameBuffer:
    """Accumulates bytes from a non-blocking pipe and splits off complete frames of `kinds`
    (anything else is a ValueError): requests on the zygote side, ready/answer frames on the host's."""

    def __init__(self, kinds: tuple[int, ...] = (REQUEST,)) -> None:
        self._buf = bytearray()
        self._kinds = kinds

    def frames(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= HEADER.size:
            size, kind = HEADER.unpack_from(self._buf)
            if size > MAX_FRAME or kind not in self._kinds:
                raise ValueError(f"bad frame (kind {kind}, {size} bytes)")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            out.append((kind, bytes(self._buf[HEADER.size:end])))
            del self._buf[:end]
        return out

    def feed(self, data: bytes) -> list[dict]:
        """Zygote side: the complete request dicts in `data` (and what came before it)."""
        return [marshal.loads(body) for _, body in self.frames(data)]


def decode_host_frame(kind: int, body: bytes) -> dict:
    """Host side: a ready frame's dict or an answer's."""
    if kind == ANSWER_KIND:
        return decode_answer(body)
    if len(body) != READY_BODY.size:
        raise ValueError("malformed ready frame")
    base_vm, slots = READY_BODY.unpack(body)
    return {"ready": True, "base_vm": base_vm, "slots": slots}
