"""Host-side process scan shared by the isolation tests of every backend (not a conftest)."""
from __future__ import annotations

import os


def host_processes_matching(text: str) -> list[int]:
    """Pids of host processes whose command line contains `text`."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if text.encode() in f.read().replace(b"\0", b" "):
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found
