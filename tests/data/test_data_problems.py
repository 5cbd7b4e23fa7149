"""Loading problem sets: named sets, file formats, field maps and line-numbered errors."""
from __future__ import annotations

import gzip
import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rstar2_cli.data.problems import EVAL_SET_NAMES, PACKAGED_SETS_DIR, DataError, load_problems


def test_eval_sets_ship_with_the_package_and_need_no_data_dir(monkeypatch):
    monkeypatch.delenv("RSTAR2_DATA_DIR", raising=False)
    sizes = {name: len(load_problems(name, allow_hub=False)) for name in ("aime24", "aime25", "math500", "hmmt25")}
    assert sizes == {"aime24": 30, "aime25": 30, "math500": 500, "hmmt25": 30}
    aime = load_problems("aime24", allow_hub=False)
    assert (aime[0].id, aime[0].answer, aime[0].source) == ("2024-I-1", "204", "aime24")
    assert aime[0].extra["year"] == 2024
    assert load_problems("aime25", allow_hub=False)[-1].answer == "240"     # 2025-II-15 (SOURCES.md)


def test_packaged_sets_match_their_recorded_checksums():
    """SOURCES.md beside the sets names each file's sha256: a changed file must change its note."""
    notes = (PACKAGED_SETS_DIR / "SOURCES.md").read_text(encoding="utf-8")
    for name in EVAL_SET_NAMES:
        digest = hashlib.sha256((PACKAGED_SETS_DIR / f"{name}.jsonl").read_bytes()).hexdigest()
        assert f"| {name}.jsonl |" in notes and f"`{digest}`" in notes, name
    for licence in ("qwen2.5-math-evaluation-MIT.txt", "matharena-MIT.txt", "areal-Apache-2.0.txt"):
        assert (PACKAGED_SETS_DIR / "licenses" / licence).is_file() and f"licenses/{licence}" in notes


def test_a_file_in_the_data_dir_wins_over_the_packaged_set(tmp_path, monkeypatch):
    (tmp_path / "aime25.jsonl").write_text(json.dumps({"id": "mine", "problem": "1+1?", "answer": "2"}) + "\n")
    [mine] = load_problems("aime25", data_dir=tmp_path, allow_hub=False)
    assert mine.id == "mine" and mine.source == "aime25"
    monkeypatch.setenv("RSTAR2_DATA_DIR", str(tmp_path))
    assert [p.id for p in load_problems("aime25", allow_hub=False)] == ["mine"]
    assert len(load_problems("aime24", allow_hub=False)) == 30             # not in the folder: the packaged one


def test_training_set_found_via_env(data_dir, monkeypatch):
    monkeypatch.setenv("RSTAR2_DATA_DIR", str(data_dir))
    assert len(load_problems("dapo_math_17k", allow_hub=False)) == 55


def test_missing_named_set_without_hub_is_one_line_error(tmp_path):
    """The training set is not shipped: without a data folder holding it, one line says where it looked."""
    with pytest.raises(DataError, match=r"dapo_math_17k: no dapo_math_17k.jsonl in"):
        load_problems("dapo_math_17k", data_dir=tmp_path, allow_hub=False)


def test_malformed_row_names_file_and_line(tmp_path):
    path = tmp_path / "x.jsonl"
    rows = [{"id": str(i), "problem": f"p{i}", "answer": "1"} for i in range(20)]
    del rows[16]["answer"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        load_problems(path)
    assert str(err.value) == f"{path}:17: missing field 'answer'"


def test_invalid_json_line_is_reported(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "problem": "p", "answer": "1"}\n{"id": \n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: invalid JSON"):
        load_problems(path)


def test_parquet_json_and_nested_field_maps(tmp_path):
    rows = [{"extra_info": {"index": 7}, "prompt": [{"role": "user", "content": "What is 1+1?"}],
             "reward_model": {"ground_truth": "2"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    for name in ("d.parquet", "d.json"):
        [p] = load_problems(tmp_path / name, id_field="extra_info.index", problem_field="prompt.0.content",
                            answer_field="reward_model.ground_truth")
        assert (p.id, p.problem, p.answer) == ("7", "What is 1+1?", "2")


def test_unsupported_suffix(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported file type '.csv'"):
        load_problems(tmp_path / "x.csv")


def test_hub_fallback_offline_is_one_line_error(tmp_path):
    """No local file (the training set is not shipped) and no network: the named hub id is tried and
    the failure is one line."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = ("from rstar2_cli.data.problems import load_problems, DataError\n"
            "try:\n    load_problems('dapo_math_17k', data_dir=%r)\nexcept DataError as e:\n    print(e)\n"
            % str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hub:BytedTsinghua-SIA/DAPO-Math-17k: load failed:"), (
        proc.stdout + proc.stderr
    )


ROW = {"id": "a", "problem": "What is 1+1?", "answer": "2"}


def test_gzip_jsonl_and_json_read_as_their_text(tmp_path):
    text = json.dumps(ROW) + "\n"
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "b.jsonl").write_bytes(gzip.compress(text.encode()))        # gzip under a plain name
    (tmp_path / "c.json.gz").write_bytes(gzip.compress(json.dumps([ROW]).encode()))
    (tmp_path / "d.jsonl").write_bytes(b"\xef\xbb\xbf" + text.encode())     # a UTF-8 byte-order mark
    for name, source in (("a.jsonl.gz", "a"), ("b.jsonl", "b"), ("c.json.gz", "c"), ("d.jsonl", "d")):
        [p] = load_problems(tmp_path / name)
        assert (p.id, p.problem, p.answer, p.source) == ("a", "What is 1+1?", "2", source), name


@pytest.mark.parametrize("name, content, message", [
    ("bin.jsonl", bytes(range(256)), r"bin.jsonl: not UTF-8 text \(binary: a NUL byte at offset 0\)"),
    ("bin.json", b"[\x80\x81]", r"bin.json: not UTF-8 text \(byte 0x80 at offset 1\)"),
    ("wide.jsonl", json.dumps(ROW).encode("utf-16"), r"wide.jsonl: not UTF-8 text \(UTF-16: save it as UTF-8\)"),
    ("zipped.jsonl", b"PK\x03\x04" + bytes(40), r"zipped.jsonl: not UTF-8 text \(a zip archive: unzip it first\)"),
    ("cut.jsonl", gzip.compress(b"x" * 5000 + b"\n")[:20], r"cut.jsonl: gzip stream cut short"),
    ("rows.parquet", b'{"id": 1}\n', r"rows.parquet: not a Parquet file \(no PAR1 header\)"),
    ("rows.parquet.gz", gzip.compress(b"PAR1"), r"rows.parquet.gz: gzip-compressed: decompress it first"),
], ids=["binary", "latin-1", "utf-16", "zip", "gzip-cut-short", "not-parquet", "gzipped-parquet"])
def test_unreadable_files_are_one_line_naming_the_file(tmp_path, name, content, message):
    from rstar2_cli.data.problems import iter_rows, unreadable

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        list(iter_rows(path))
    assert unreadable(path) is not None


def test_a_bad_byte_deep_in_a_file_names_its_line(tmp_path):
    from rstar2_cli.data.problems import iter_rows, unreadable

    good = (json.dumps(ROW) + "\n").encode()
    path = tmp_path / "late.jsonl"
    path.write_bytes(good * 5000 + b'{"id": "caf\xe9"}\n' + good)
    assert unreadable(path) is None                  # the head is text: only reading finds the byte
    with pytest.raises(DataError, match=r"late.jsonl:5001: not UTF-8 text \(byte 0xe9 at column 12\)"):
        list(iter_rows(path))
    gz = tmp_path / "late.jsonl.gz"
    gz.write_bytes(gzip.compress(good * 5000)[:-30])
    with pytest.raises(DataError, match=r"late.jsonl.gz: gzip stream cut short"):
        list(iter_rows(gz))


def test_a_broken_parquet_file_is_one_line(tmp_path):
    path = tmp_path / "broken.parquet"
    pq.write_table(pa.Table.from_pylist([ROW] * 50), path)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(DataError, match=r"broken.parquet: not a readable Parquet file \("):
        load_problems(path)
