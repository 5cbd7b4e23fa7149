"""What the benchmark scripts share: their wall-clock timing and their JSON result file.

A script times what it measures with `Stopwatch` (and its baseline the same way, in the same run:
the machines are shared and noisy) and writes its figures with `write_json`, to the path its
`--json` option names (`add_json_option`; the GPU checks take `--out` and always write).

Standard library only: the GPU scripts run on the lent GPU image, which has no project install
(gpu/gpu_image.py). Scripts import it by file name (`from harness import ...`) with `benchmarks/`
on sys.path, as they import `sim`; pyproject.toml's pytest `pythonpath` has it for the tests.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


class Stopwatch:
    """Wall-clock seconds (`time.perf_counter`) of a `with` block: `with Stopwatch() as sw: ...`,
    then `sw.seconds`; `sw.elapsed()` reads the time so far, inside the block or after it."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def add_json_option(ap: argparse.ArgumentParser, help: str = "also write the results here, as JSON") -> None:
    ap.add_argument("--json", type=Path, default=None, help=help)


def write_json(path: str | Path | None, data: Any, *, indent: int | None = 1) -> None:
    """`data` as JSON at `path`, its folder made; a value JSON has no type for (a Path, a dtype) is
    written as its str(). Nothing when `path` is None (no `--json` given)."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=str) + "\n")
