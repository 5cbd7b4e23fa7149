"""Math problem sets as one `Problem` type, read from local files, the evaluation sets shipped in
the package, or the Hugging Face hub.

Training (RL), hard-subset mining and evaluation all need the same `(id, problem, answer)`
triples, but every source names its fields differently (DAPO keeps the problem inside a chat
prompt, MATH-500 calls its id `unique_id`...). This module hides that behind `load_problems`,
and reports a bad row as `DataError: <file>:<line>: <what>` so a broken file is fixed in one go.
`iter_rows` is the one reader of data files (problem sets, SFT inputs, eval sets): it reads a
gzip-compressed .jsonl or .json as its text, and a file that is not what its name says (binary
data, another encoding, an archive, a cut gzip stream) is one DataError naming it (`unreadable`,
which the commands' checks also run before they load anything).
"""
from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator

DATA_DIR_ENV = "RSTAR2_DATA_DIR"
EVAL_SET_NAMES = ("aime24", "aime25", "math500", "hmmt25")
# Copies of EVAL_SET_NAMES shipped in the package, read when no data folder holds the set, so the
# paper's evaluation runs offline (sources, licences and checksums: eval_sets/SOURCES.md).
PACKAGED_SETS_DIR = Path(__file__).with_name("eval_sets")
NAMED_SETS = (*EVAL_SET_NAMES, "dapo_math_17k")
GZIP_MAGIC = b"\x1f\x8b"                 # RFC 1952's ID1 ID2
GZIP_FORMATS = (".jsonl", ".json")       # read through gzip when compressed; .parquet compresses its own columns
SNIFF_BYTES = 1 << 16                    # how much of a file `unreadable` looks at
# Signatures of files that are not UTF-8 text (looked up once a head is not text), and what to do.
NOT_TEXT = ((b"PAR1", "a Parquet file: name it .parquet"), (b"PK\x03\x04", "a zip archive: unzip it first"),
            (b"BZh", "bzip2-compressed: decompress it first"), (b"\xfd7zXZ\x00", "xz-compressed: decompress it first"),
            (b"\x28\xb5\x2f\xfd", "zstd-compressed: decompress it first"),
            (codecs.BOM_UTF16_LE, "UTF-16: save it as UTF-8"), (codecs.BOM_UTF16_BE, "UTF-16: save it as UTF-8"))


class DataError(ValueError):
    """A data file or row is unusable; the message names the file (and line) to fix."""


@dataclass(frozen=True)
class HubSource:
    """Where a named set lives on the hub and how its columns map to ours (dotted paths)."""

    dataset_id: str
    split: str
    id_field: str
    problem_field: str
    answer_field: str
    config: str | None = None


# Checked against the dataset cards (columns listed there); ids are the ones papers use.
HUB_IDS: dict[str, HubSource] = {
    "aime24": HubSource("HuggingFaceH4/aime_2024", "train", "id", "problem", "answer"),
    "aime25": HubSource("math-ai/aime25", "test", "id", "problem", "answer"),
    "math500": HubSource("HuggingFaceH4/MATH-500", "test", "unique_id", "problem", "answer"),
    "hmmt25": HubSource("MathArena/hmmt_feb_2025", "train", "problem_idx", "problem", "answer"),
    # Generalization sets (eval/benchmarks.py reads their own columns; problem/answer name the main
    # ones). GPQA is gated: accept its terms on the dataset page and `huggingface-cli login`.
    # BFCL's questions ship inside the bfcl-eval package (eval/bfcl.py), so it has no hub id.
    "gpqa_diamond": HubSource("Idavidrein/gpqa", "train", "Record ID", "Question", "Correct Answer",
                              config="gpqa_diamond"),
    "ifeval": HubSource("google/IFEval", "train", "key", "prompt", "instruction_id_list"),
    # Upstream repeats each of its 17,917 prompts 100 times; dedup in prepare_math removes them.
    # The problem sits inside the DAPO instruction template, which prepare_math strips.
    "dapo_math_17k": HubSource(
        "BytedTsinghua-SIA/DAPO-Math-17k", "train", "extra_info.index", "prompt.0.content",
        "reward_model.ground_truth",
    ),
}


@dataclass
class Problem:
    """One math problem with its reference answer, in the trainer's schema plus extras."""

    id: str
    problem: str
    answer: str
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, str]:
        return {"id": self.id, "problem": self.problem, "answer": self.answer, "source": self.source}


def get_field(row: dict[str, Any], path: str) -> Any:
    """Value at a dotted path (`reward_model.ground_truth`, `prompt.0.content`); KeyError if absent."""
    value: Any = row
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


def data_format(path: Path) -> str:
    """A data file's format suffix, lower-case, a trailing `.gz` set aside: `a.jsonl.gz` -> `.jsonl`."""
    name = path.name.lower()
    return Path(name[:-3] if name.endswith(".gz") else name).suffix


def data_stem(path: Path) -> str:
    """A data file's name without its format suffix (and `.gz`): the set name rows are tagged with."""
    name = path.name[:-3] if path.name.lower().endswith(".gz") else path.name
    return Path(name).stem


def unreadable(path: Path) -> str | None:
    """Why the data file `path` cannot be read as its format, in a few words; None when its head can.

    Reads at most `SNIFF_BYTES` (of the decompressed text for gzip), so it answers within a moment
    for any size: a gzip stream (`GZIP_MAGIC`) is accepted for `GZIP_FORMATS` and read as its text,
    elsewhere refused. Bytes that are not UTF-8, or a NUL byte, are not text: the error names the
    first, or the file's kind where its signature is known (`NOT_TEXT`: Parquet, zip, bzip2, xz,
    zstd, UTF-16) with what to do. A .parquet file must start with PAR1. A text file of nothing but
    whitespace has no rows. A bad byte past the head is `iter_rows`' to find, with its line.
    """
    fmt = data_format(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(SNIFF_BYTES)
            whole = not fh.read(1)
    except OSError as e:
        return f"cannot read it ({e.strerror or e})"
    head, complete = raw, whole
    if raw.startswith(GZIP_MAGIC):
        if fmt not in GZIP_FORMATS:
            return "gzip-compressed: decompress it first (gunzip)"
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)      # a gzip header and trailer
        try:
            head = inflate.decompress(raw, SNIFF_BYTES)
        except zlib.error as e:
            return f"not a valid gzip stream ({e})"
        if whole and not inflate.eof and not inflate.unconsumed_tail and len(head) < SNIFF_BYTES:
            return "gzip stream cut short"
        complete = whole and inflate.eof
    if fmt == ".parquet":
        return None if head.startswith(b"PAR1") else "not a Parquet file (no PAR1 header)"
    nul = head.find(b"\0")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
        first_bad = None
    except UnicodeDecodeError as e:
        first_bad = e.start
    if nul >= 0 and (first_bad is None or nul < first_bad):
        bad = f"binary: a NUL byte at offset {nul}"
    elif first_bad is not None:
        bad = f"byte 0x{head[first_bad]:02x} at offset {first_bad}"
    elif complete and not head.strip():
        return "no rows (the file is empty)"
    else:
        return None
    known = next((what for magic, what in NOT_TEXT if head.startswith(magic)), bad)
    return f"not UTF-8 text ({known})"


def open_bytes(path: Path) -> IO[bytes]:
    """`path` opened for reading bytes; a gzip file (by its first bytes, whatever its name) decompressed."""
    with path.open("rb") as fh:
        gz = fh.read(len(GZIP_MAGIC)) == GZIP_MAGIC
    return gzip.open(path, "rb") if gz else path.open("rb")


def _utf8(raw: bytes, where: str, at: Callable[[int], str]) -> str:
    """`raw` (a UTF-8 byte-order mark dropped) as text; DataError `where: not UTF-8 text (byte .. at ..)`."""
    raw = raw.removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at {at(e.start)})") from None


def iter_rows(
    path: Path, on_error: Callable[[DataError], None] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line-or-row number starting at 1, row dict) from a .jsonl, .json or .parquet file.

    A .jsonl or .json file may be gzip-compressed (named `.jsonl.gz`, or plain `.jsonl`): it is read
    as its text. The file is checked first (`unreadable`); text that is not UTF-8 further in raises
    DataError naming the line. An unparsable .jsonl line raises DataError, or, with `on_error`, is
    passed to it and skipped.
    """
    fmt = data_format(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if fmt not in (".jsonl", ".json", ".parquet"):
        shown = "".join(path.suffixes[-2:]) if path.name.lower().endswith(".gz") else path.suffix
        raise DataError(f"{path}: unsupported file type {shown!r} (use .jsonl, .json or .parquet; "
                        f"the first two may be gzip-compressed)")
    reason = unreadable(path)
    if reason:
        raise DataError(f"{path}: {reason}")
    readers = {".jsonl": lambda: _jsonl_rows(path, on_error), ".json": lambda: _json_rows(path),
               ".parquet": lambda: _parquet_rows(path)}
    try:
        yield from readers[fmt]()
    except EOFError:          # gzip's "Compressed file ended before the end-of-stream marker was reached"
        raise DataError(f"{path}: gzip stream cut short") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path}: not a valid gzip stream ({e})") from None


def _jsonl_rows(path: Path, on_error: Callable[[DataError], None] | None) -> Iterator[tuple[int, dict[str, Any]]]:
    with open_bytes(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            line = _utf8(raw, f"{path}:{lineno}", lambda i: f"column {i + 1}")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            except (json.JSONDecodeError, DataError) as e:
                err = e if isinstance(e, DataError) else DataError(f"{path}:{lineno}: invalid JSON ({e.msg})")
                if on_error is None:
                    raise err from None
                on_error(err)
                continue
            yield lineno, row


def _json_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open_bytes(path) as fh:
        raw = fh.read()
    newline = b"\n"
    text = _utf8(raw, str(path), lambda i: f"line {raw.count(newline, 0, i) + 1}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if isinstance(data, dict):  # {"data": [...]} or similar single-key wrapper
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects (or one key holding it)")
    for i, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{i}: item is not an object")
        yield i, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:     # ArrowInvalid, ArrowIOError (= OSError): pyarrow/error.pxi
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{path}: not a readable Parquet file ({first})") from None
    yield from enumerate(table.to_pylist(), 1)


def rows_to_problems(
    rows: Iterator[tuple[int, dict[str, Any]]], where: str, source: str, *, id_field: str,
    problem_field: str, answer_field: str,
) -> list[Problem]:
    """Map raw rows to Problems; a missing/empty field raises `DataError: where:line: ...`."""
    problems = []
    used = {id_field, problem_field, answer_field}
    for lineno, row in rows:
        values = {}
        for name in (problem_field, answer_field):
            try:
                value = get_field(row, name)
            except KeyError:
                raise DataError(f"{where}:{lineno}: missing field {name!r}") from None
            if value is None or not str(value).strip():
                raise DataError(f"{where}:{lineno}: empty field {name!r}")
            values[name] = str(value)
        try:
            pid = str(get_field(row, id_field))
        except KeyError:
            pid = f"{source}-{lineno:05d}"  # sets without ids get stable positional ones
        extra = {k: v for k, v in row.items() if k not in used}
        problems.append(Problem(pid, values[problem_field], values[answer_field], source, extra))
    return problems


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The directory holding `<name>.jsonl` sets: the argument, else $RSTAR2_DATA_DIR."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    return Path(chosen) if chosen else None


def find_named_set_file(name: str, root: Path | None) -> Path | None:
    """`<root>/<name>.jsonl` (else .parquet, else .json), the first that exists; else the packaged
    copy of an evaluation set (PACKAGED_SETS_DIR); None if neither. A file in the data folder
    wins, so a user's own version of a set replaces the shipped one."""
    if root is not None:
        found = next((c for c in (root / f"{name}{s}" for s in (".jsonl", ".parquet", ".json")) if c.is_file()), None)
        if found is not None:
            return found
    packaged = PACKAGED_SETS_DIR / f"{name}.jsonl"
    return packaged if name in EVAL_SET_NAMES and packaged.is_file() else None


def load_hub_source(spec: HubSource, source: str) -> list[Problem]:
    """Download a hub dataset with `datasets.load_dataset` (needs network or a warm HF cache)."""
    import datasets  # lazy: datasets (~0.7 s), only for a set read from the Hub

    try:
        ds = datasets.load_dataset(spec.dataset_id, spec.config, split=spec.split)
    except Exception as e:  # offline, gated, renamed... one line naming the set and the cause
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"hub:{spec.dataset_id}: load failed: {type(e).__name__}: {first_line}") from None
    return rows_to_problems(enumerate(ds, 1), f"hub:{spec.dataset_id}", source, id_field=spec.id_field,
                            problem_field=spec.problem_field, answer_field=spec.answer_field)


def load_problems(
    path_or_name: str | os.PathLike, *, data_dir: str | os.PathLike | None = None,
    id_field: str = "id", problem_field: str = "problem", answer_field: str = "answer",
    allow_hub: bool = True,
) -> list[Problem]:
    """Problems from a file path, or from a named set (`aime24`, `math500`, ...).

    A named set is read from `<data_dir>/<name>.jsonl` (or .parquet/.json), else from the copy
    shipped in the package (the evaluation sets); when neither exists it is fetched from the hub id
    in `HUB_IDS` (if `allow_hub`). Field names may be dotted
    paths into nested rows. Raises DataError naming the file and line for any bad row.
    """
    text = str(path_or_name)
    path = Path(text)
    if text in NAMED_SETS and not path.exists():
        root = resolve_data_dir(data_dir)
        found = find_named_set_file(text, root)
        if found is not None:
            return rows_to_problems(iter_rows(found), str(found), text, id_field=id_field,
                                    problem_field=problem_field, answer_field=answer_field)
        if not allow_hub:
            raise DataError(f"{text}: no {text}.jsonl in {root or f'${DATA_DIR_ENV} (unset)'}")
        return load_hub_source(HUB_IDS[text], text)
    return rows_to_problems(iter_rows(path), str(path), data_stem(path), id_field=id_field,
                            problem_field=problem_field, answer_field=answer_field)
