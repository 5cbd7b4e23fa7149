"""A recipe as text: its YAML file read into a mapping, and `--set a.b=c` overrides applied to that
mapping before validation (rstar2_cli/config.py validates the result), with one-line errors
naming the file or the override."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A recipe or override is invalid. The message is one line naming the file and field."""


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], yaml-parsed c). Values parse as YAML: 1e-6, true, [1,2], null."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set optim.lr=1e-6")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: empty key segment")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item!r}: value is not valid YAML ({str(e).splitlines()[0]})") from None
    # YAML 1.1 reads 1e-6 as a string; accept scientific notation as float.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in "e.") and value.strip() else value
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = raw
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
            node = nxt
        node[path[-1]] = value
    return raw


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, or a one-line ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: recipe file not found")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(raw).__name__}")
    return raw
