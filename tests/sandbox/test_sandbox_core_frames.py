"""The zygote's building blocks that no end-to-end test pins down exactly: the wire frames, the
compile-before-fork path and the scratch wipe."""
from __future__ import annotations

import io
import os
import sys

import pytest

from sandbox.inside.child import compile_cell, execute, precompile, PRECOMPILE_MAX_CHARS
from sandbox.inside.frames import (ANSWER_KIND, READY, FrameBuffer, decode_answer, decode_host_frame, encode_answer,
                              encode_ready, encode_request)
from sandbox.inside.scratch import remove_tree


def _read(data: bytes) -> dict:
    (frame,) = FrameBuffer((READY, ANSWER_KIND)).frames(data)
    return decode_host_frame(*frame)


def test_answer_frame_round_trips_bytes_and_missing_exit_code():
    frame = encode_answer(7, None, 0.25, "timeout", "héllo\n".encode(), b"\xff bad utf8")
    got = _read(frame)
    assert got == {"id": 7, "exit_code": None, "wall_time": 0.25, "reason": "timeout",
                   "stdout": "héllo\n", "stderr": "\ufffd bad utf8"}
    assert _read(encode_answer(8, 3, 0.0, "runtime_error", b"", b""))["exit_code"] == 3
    assert _read(encode_ready(4096, 8)) == {"ready": True, "base_vm": 4096, "slots": 8}


def test_a_malformed_answer_is_rejected_not_misread():
    body = encode_answer(1, 0, 0.1, "ok", b"abc", b"")[5:]
    with pytest.raises(ValueError):
        decode_answer(body[:-1])  # lengths no longer add up


def test_requests_split_across_reads_are_reassembled():
    frames = encode_request({"id": 1, "code": "print(1)"}) + encode_request({"id": 2, "code": "x" * 5000})
    buf, got = FrameBuffer(), []
    for i in range(0, len(frames), 777):
        got += buf.feed(frames[i:i + 777])
    assert [g["id"] for g in got] == [1, 2] and got[1]["code"] == "x" * 5000
    with pytest.raises(ValueError):
        FrameBuffer().feed(encode_ready(4096, 8))  # only requests flow to a zygote
    with pytest.raises(ValueError):
        FrameBuffer((READY, ANSWER_KIND)).frames(frames)  # and only ready/answer frames back


@pytest.fixture
def cell(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO())

    def run(code, compiled):
        result = execute(code, None, None, compiled)
        out = capsys.readouterr()
        return result, out.out, out.err
    return run


@pytest.mark.parametrize("code", ["x = 6\nx * 7", "print('hi')\n1 + 1", "def f(x):\n    return 1 / x\nf(0)",
                                  "import sys\nsys.exit(3)", "None"])
def test_precompiled_cells_behave_exactly_like_cells_compiled_in_the_child(cell, code):
    assert cell(code, precompile(code)) == cell(code, None)


def test_precompile_leaves_errors_and_long_cells_to_the_child(cell):
    assert precompile("x = (") is None  # the child recompiles it and reports the SyntaxError
    assert cell("x = (", None)[2].startswith("Line 1: SyntaxError")
    long = "x = 1\n" * (PRECOMPILE_MAX_CHARS // 6 + 1)
    assert precompile(long) is None and compile_cell(long)[1] is None


def test_scratch_wipe_deletes_everything_but_never_follows_symlinks(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    scratch = tmp_path / "slot0"
    (scratch / "a" / "b").mkdir(parents=True)
    (scratch / "a" / "f.txt").write_text("x")
    os.symlink(outside, scratch / "a" / "dirlink")
    os.symlink(outside / "keep.txt", scratch / "filelink")
    remove_tree(str(scratch))
    assert not scratch.exists()
    assert (outside / "keep.txt").read_text() == "precious"
