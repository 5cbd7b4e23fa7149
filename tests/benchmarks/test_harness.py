"""benchmarks/harness.py, the benchmark scripts' timing and JSON file: what a script's `--json` leaves."""
from __future__ import annotations

import json
import time
from pathlib import Path

from harness import Stopwatch, write_json


def test_write_json_makes_the_folder_and_writes_what_json_has_no_type_for_as_text(tmp_path):
    path = tmp_path / "runs" / "a" / "result.json"
    write_json(path, {"model": Path("/m"), "seconds": 1.5, "rows": [1, 2]})
    assert json.loads(path.read_text()) == {"model": "/m", "seconds": 1.5, "rows": [1, 2]}
    write_json(None, {"unused": 1})            # no --json: nothing written, no error


def test_the_stopwatch_times_its_block_and_reads_the_time_so_far():
    with Stopwatch() as sw:
        time.sleep(0.05)
        inside = sw.elapsed()
    assert 0.05 <= inside <= sw.seconds < 1.0
    assert sw.elapsed() >= sw.seconds
