"""Checks that a test's fake of a vLLM/torch/engine API has the real API's shape, so a fake cannot
drift from what it stands in for (the installed versions are the reference)."""
from __future__ import annotations

import inspect
from typing import Any, Callable


def _shape(fn: Callable) -> tuple[bool, list[tuple[str, Any, Any]]]:
    params = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    return inspect.iscoroutinefunction(fn), params


def assert_same_signature(fake: Callable, real: Callable) -> None:
    """Same parameter names, kinds and defaults (annotations aside), and both async or neither."""
    assert _shape(fake) == _shape(real), (
        f"fake {fake.__qualname__}{inspect.signature(fake)} != real {real.__qualname__}{inspect.signature(real)}")


def assert_fake_methods_match(fake_cls: type, real_cls: type, names: list[str]) -> None:
    for name in names:
        assert_same_signature(getattr(fake_cls, name), getattr(real_cls, name))


def assert_call_binds(real: Callable, *args: Any, **kwargs: Any) -> None:
    """A call a fake recorded is one the real function accepts (`self` excluded)."""
    inspect.signature(real).bind(None, *args, **kwargs)
