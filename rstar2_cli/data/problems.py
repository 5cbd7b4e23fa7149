"""Math problem sets as one `Problem` type, read from local files or the Hugging Face hub.

Training (RL), hard-subset mining and evaluation all need the same `(id, problem, answer)`
triples, but every source names its fields differently (DAPO keeps the problem inside a chat
prompt, MATH-500 calls its id `unique_id`...). This module hides that behind `load_problems`,
and reports a bad row as `DataError: <file>:<line>: <what>` so a broken file is fixed in one go.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

DATA_DIR_ENV = "RSTAR2_DATA_DIR"
EVAL_SET_NAMES = ("aime24", "aime25", "math500", "hmmt25")
NAMED_SETS = (*EVAL_SET_NAMES, "dapo_math_17k")


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


def iter_rows(
    path: Path, on_error: Callable[[DataError], None] | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line-or-row number starting at 1, row dict) from a .jsonl, .json or .parquet file.

    An unparsable .jsonl line raises DataError, or, with `on_error`, is passed to it and skipped.
    """
    suffix = path.suffix.lower()
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
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
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        if isinstance(data, dict):  # {"data": [...]} or similar single-key wrapper
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"{path}: expected a list of objects (or one key holding it)")
            data = lists[0]
        for i, row in enumerate(data, 1):
            if not isinstance(row, dict):
                raise DataError(f"{path}:{i}: item is not an object")
            yield i, row
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), 1):
            yield i, row
    else:
        raise DataError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")


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
    """`<root>/<name>.jsonl` (else .parquet, else .json), the first that exists; None if none."""
    if root is None:
        return None
    return next((c for c in (root / f"{name}{s}" for s in (".jsonl", ".parquet", ".json")) if c.is_file()), None)


def load_hub_source(spec: HubSource, source: str) -> list[Problem]:
    """Download a hub dataset with `datasets.load_dataset` (needs network or a warm HF cache)."""
    import datasets

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

    A named set is read from `<data_dir>/<name>.jsonl` (or .parquet/.json); when no local file
    exists it is fetched from the hub id in `HUB_IDS` (if `allow_hub`). Field names may be dotted
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
    return rows_to_problems(iter_rows(path), str(path), path.stem, id_field=id_field,
                            problem_field=problem_field, answer_field=answer_field)
