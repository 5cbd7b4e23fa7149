"""Per-call resource limits, validated once at construction so a typo fails loudly and early."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Limits:
    timeout: float = 10.0  # wall seconds per call
    cpu_time: float = 10.0  # CPU seconds per call (RLIMIT_CPU)
    memory_mb: int = 1024  # address-space allowance per call, over the preloaded zygote
    max_processes: int = 32  # RLIMIT_NPROC per call (each call runs under its own uid)
    max_output_bytes: int = 65536  # stdout+stderr cap per call

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"Limits.{f.name}: expected a number, got {value!r}")
            if value <= 0:
                raise ValueError(f"Limits.{f.name}: must be > 0, got {value!r}")

    def for_call(self, timeout: float | None) -> dict:
        """The limits one call runs under. A larger explicit timeout also raises the CPU cap,
        so a caller asking for 60 s is not cut off by the 10 s CPU default."""
        out = dict(vars(self))  # flat numbers: no need for asdict's recursive copy on every call
        if timeout is not None:
            if timeout <= 0:
                raise ValueError(f"timeout: must be > 0, got {timeout!r}")
            out["timeout"] = float(timeout)
            out["cpu_time"] = max(self.cpu_time, float(timeout))
        return out
