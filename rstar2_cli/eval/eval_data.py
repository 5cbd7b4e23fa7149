"""`rstar2 prepare eval-data`: put GPQA-Diamond and IFEval where `rstar2 eval` reads them.

Both sets are on the Hub (GPQA gated), so an offline machine has neither. A user with the files
(GPQA's `gpqa_diamond.csv` from its release, or a jsonl / json / parquet export of
`Idavidrein/gpqa`; IFEval's `input_data.jsonl` or an export of `google/IFEval`), or with the sets
in the local Hugging Face datasets cache, writes them here as `<out>/gpqa_diamond.jsonl` and
`<out>/ifeval.jsonl`, the data dir `rstar2 eval --data-dir` (or $RSTAR2_DATA_DIR) reads. Every
row goes through the family's own reader first (`problem_from_row`, which also checks IFEval's
instruction ids against lm-eval's registry), so a bad row stops the command with one line naming
the file, the row and the field, and nothing is written for that set.
"""
from __future__ import annotations

import csv
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from rstar2_cli.data.problems import HUB_IDS, DataError, iter_rows
from rstar2_cli.eval.gpqa import SOURCE_COLUMNS
from rstar2_cli.eval.gpqa import problem_from_row as gpqa_row
from rstar2_cli.eval.ifeval import problem_from_row as ifeval_row

# The columns each written file keeps (the Hub's names; the families read these).
COLUMNS = {"gpqa_diamond": ("Record ID", "Question", *SOURCE_COLUMNS),
           "ifeval": ("key", "prompt", "instruction_id_list", "kwargs")}
READERS: dict[str, Callable[[dict[str, Any], str, int], Any]] = {"gpqa_diamond": gpqa_row, "ifeval": ifeval_row}
EXPECTED_ROWS = {"gpqa_diamond": 198, "ifeval": 541}     # the Hub sets' sizes (dataset cards)


def file_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a .csv (numbered by line, the header being line 1), else of what iter_rows reads."""
    if path.suffix.lower() != ".csv":
        yield from iter_rows(path)
        return
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(encoding="utf-8", newline="") as fh:
        for lineno, row in enumerate(csv.DictReader(fh), 2):
            yield lineno, dict(row)


@contextmanager
def offline_hub() -> Iterator[None]:
    """huggingface_hub and datasets in offline mode for the block (their flags are module
    constants read from the environment at import), restored after."""
    import datasets.config  # lazy: datasets (~0.7 s), only for a set read from the Hub cache
    import huggingface_hub.constants as hub

    saved = hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE
    hub.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        hub.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE = saved


def hub_cache_rows(name: str) -> tuple[str, Iterator[tuple[int, dict[str, Any]]]]:
    """A set's rows from the local Hugging Face datasets cache, never the network."""
    import datasets  # lazy: datasets (~0.7 s), only for a set read from the Hub cache

    spec = HUB_IDS[name]
    try:
        with offline_hub():
            ds = datasets.load_dataset(spec.dataset_id, spec.config, split=spec.split)
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"hub:{spec.dataset_id}: not in the local Hugging Face datasets cache ({first})") from None
    return f"hub:{spec.dataset_id}", enumerate(ds, 1)


def write_set(name: str, where: str, rows: Iterator[tuple[int, dict[str, Any]]], out_dir: Path) -> dict[str, Any]:
    """Validate every row of `name` and write `<out_dir>/<name>.jsonl`; {"set", "path", "rows", "note"}."""
    keep, seen, read = COLUMNS[name], {}, READERS[name]
    written = []
    for lineno, row in rows:
        problem = read(row, where, lineno)
        if problem.id in seen:
            raise DataError(f"{where}:{lineno}: duplicate id {problem.id!r} (first at row {seen[problem.id]})")
        seen[problem.id] = lineno
        out = {c: row[c] for c in keep if c in row}
        if name == "gpqa_diamond":
            out["Record ID"] = problem.id
        written.append(out)
    if not written:
        raise DataError(f"{where}: no rows")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in written), encoding="utf-8")
    tmp.replace(path)
    note = "" if len(written) == EXPECTED_ROWS[name] else f" (the Hub set has {EXPECTED_ROWS[name]})"
    return {"set": name, "path": str(path), "rows": len(written), "note": note}


def prepare_eval_data(out_dir: Path, files: dict[str, Path | None], from_hub: bool) -> list[dict[str, Any]]:
    """Write each set given as a file, or (with `from_hub`) found in the datasets cache; a set
    the cache lacks is reported with {"set", "skipped": why}, and DataError when none was written."""
    done: list[dict[str, Any]] = []
    for name in COLUMNS:
        path = files.get(name)
        if path is not None:
            done.append(write_set(name, str(path), file_rows(path), out_dir))
        elif from_hub:
            try:
                where, rows = hub_cache_rows(name)
            except DataError as e:
                done.append({"set": name, "skipped": str(e)})
                continue
            done.append(write_set(name, where, rows, out_dir))
    if done and all("skipped" in d for d in done):
        raise DataError("; ".join(d["skipped"] for d in done))
    return done
