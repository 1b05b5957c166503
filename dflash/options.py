"""Closed sets of string options, and reading one back as a plain string.

Library modules take options as plain strings (`choice(cfg.x)`); each config section's
schema (beside the code that reads it) turns its module's own tuple of options into an
enum, so a typo fails at start with the valid values listed and the list lives in one
place.
"""
from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """A closed set of string options: a typo fails at start with the valid values listed."""

    def __str__(self) -> str:
        return self.value


def choice(value) -> str:
    """The plain string of a config option (works for enums and raw strings alike)."""
    return value.value if isinstance(value, Enum) else str(value)


def options(name: str, values) -> type[Choice]:
    """An enum of `values` (each its own value), for a schema field."""
    return Choice(name, {v: v for v in values})
