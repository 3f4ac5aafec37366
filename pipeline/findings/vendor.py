"""vendor: the device vendor a trace ran on, which picks each remedy's wording (`worded`).

One of `VENDORS`: `cpu` (no device activity), `nvidia`, `amd`, `ascend`, or `other` (a device
nothing names: Intel XPU / Gaudi, a PrivateUse1 backend, ...). Told apart by data ([vendors] of
data/findings.toml), first that answers: no device -> cpu; the trace's layout (torch_npu's ->
ascend); the devices' names and the specs matched to them; the names of the runtime calls
(`hipLaunchKernel`, `cudaLaunchKernel`, ...); else [vendors] fallback.

A remedy that names a vendor's mechanism is a table in the rule's data, `<key>.default` plus an
override per vendor (`<key>.nvidia`, `<key>.ascend`, ...): `worded(rule, key, vendor)` is the
vendor's text, else the default. A plain string is every vendor's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import polars as pl

from pipeline.findings.limits import limits, table

VENDORS = ("nvidia", "amd", "ascend", "cpu", "other")


def rules() -> dict:
    """[vendors] of data/findings.toml."""
    return dict(table()["vendors"])


def by_layout(layout: str | None) -> str | None:
    """The vendor a Kineto layout id implies (None: the layout does not say)."""
    return rules()["layouts"].get(layout or "")


def by_names(names: Iterable[str | None]) -> str | None:
    """The vendor the first device name [vendors] names recognises (in their order) says."""
    given = [n for n in names if n]
    for vendor, rx in rules()["names"].items():
        if any(re.search(rx, n) for n in given):
            return vendor
    return None


def trace_vendor(f) -> str:
    """The vendor of a flattened trace (`analyses.flat.Flat`)."""
    if not f.has_gpu:
        return "cpu"
    trace = f.scan("trace")
    if "layout" in trace.collect_schema().names():
        found = by_layout(trace.select("layout").collect().item())
        if found:
            return found
    names = f.device_names["name"].to_list()
    specs = f.activity.specs
    names += specs["spec_name"].to_list() if "spec_name" in specs.columns else []
    found = by_names(names)
    if found:
        return found
    runtime = rules()["runtime"]
    either = "|".join(f"(?:{p})" for p in runtime.values())
    calls = f.scan("events").filter(pl.col("name").str.contains(either)).select("name").head(1).collect()
    if calls.height:
        name = calls["name"][0]
        return next(v for v, p in runtime.items() if re.search(p, name))
    return str(rules()["fallback"])


def worded(rule: str, key: str, vendor: str, **fill: str) -> str:
    """The text of a rule's `key` for a vendor (its override, else `default`), `str.format`ted
    with `fill`."""
    v = limits(rule)[key]
    text = v if isinstance(v, str) else v.get(vendor, v["default"])
    return text.format(**fill) if fill else text
