"""limits: the findings' thresholds, name patterns and saving factors, from data/findings.toml.

Each rule reads its own table (`limits(rule_id)`: its numbers and patterns, with the [common]
ones under theirs); `marks()` are the CPU-side slices the rules look for, by key.
"""

from __future__ import annotations

from functools import cache

from pipeline.resources import find_dir, read_toml

FILE = "findings.toml"


@cache
def table() -> dict:
    return read_toml(find_dir("data") / FILE)


def limits(rule: str) -> dict:
    """A rule's table, over the [common] one."""
    t = table()
    return {**t["common"], **t.get(rule, {})}


def marks() -> dict[str, str]:
    """key -> name regex of the CPU-side slices the rules look for."""
    return dict(table()["marks"])
