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
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read the recipe ({e})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{yaml_error_place(p, e)}: not valid YAML ({yaml_problem(e)})") from None
    if raw is None:    # an empty file (or only comments) would silently mean every default
        raise ConfigError(f"{p}: the recipe is empty; give its settings (rstar2_cli/recipes/stage1.yaml shows them)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping, got {type(raw).__name__}")
    return raw


def yaml_error_place(path: Path, e: yaml.YAMLError) -> str:
    """`file:line:column` of a YAML error (1-based, where the parser says the problem is)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def yaml_problem(e: yaml.YAMLError) -> str:
    """The parser's own words for a YAML error, on one line."""
    words = ": ".join(w for w in (getattr(e, "context", None), getattr(e, "problem", None)) if w)
    return words or str(e).splitlines()[0]
