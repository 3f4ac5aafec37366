"""rules: the rules over one trace (RULES), run in order by `trace_findings`; the findings as
`analyze`'s findings section (`findings_frame`) and as one flat table (`flat_view`).

A rule is a function of the trace's `Facts` returning a `Finding` or None (its premise does not
hold). Findings are sorted by the high end of their saving, largest first, after those about
the window itself (`finding.ABOUT_THE_WINDOW`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import polars as pl

from pipeline.analyses.flat import Flat
from pipeline.findings.comm_exposed import comm_exposed
from pipeline.findings.compile_breaks import compile_breaks
from pipeline.findings.copies import copies
from pipeline.findings.dataloader import dataloader
from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ranked
from pipeline.findings.fusion import fusion
from pipeline.findings.host_bound import host_bound
from pipeline.findings.layout import layout
from pipeline.findings.optimizer import optimizer
from pipeline.findings.precision import precision
from pipeline.findings.small_kernels import small_kernels
from pipeline.findings.sync import sync
from pipeline.findings.warmup import warmup
from pipeline.render.findings import FLAT_COLUMNS, flat_rows

__all__ = ["RULES", "Evidence", "Facts", "Finding", "findings_frame", "flat_view", "trace_findings"]

RULES: tuple[Callable[[Facts], Finding | None], ...] = (
    dataloader,
    sync,
    host_bound,
    small_kernels,
    fusion,
    layout,
    precision,
    optimizer,
    copies,
    comm_exposed,
    compile_breaks,
    warmup,
)


def trace_findings(f: Flat, section: Callable[[str], pl.DataFrame]) -> list[Finding]:
    """RULES over one trace (`section(name)`: an analysis section's frame)."""
    facts = Facts(f, section)
    found = [x for rule in RULES if (x := rule(facts)) is not None]
    return ranked([replace(x, window_us=facts.span_us) for x in found])


EVIDENCE = pl.List(
    pl.Struct(
        {
            "what": pl.String,
            "name": pl.String,
            "count": pl.Int64,
            "time_us": pl.Float64,
            "pct": pl.Float64,
            "pct_of": pl.String,
            "note": pl.String,
        }
    )
)
SCHEMA: pl.Schema = pl.Schema(
    {  # type: ignore[arg-type]  # polars' stubs do not take a List / Struct instance here
        "id": pl.String,
        "title": pl.String,
        "gain_us": pl.List(pl.Float64),
        "gain_pct": pl.List(pl.Float64),
        "gpu_gain_us": pl.List(pl.Float64),
        "remedy": pl.String,
        "section": pl.String,
        "evidence": EVIDENCE,
        "basis": pl.String,
        "window_us": pl.Float64,
    }
)


def findings_frame(found: list[Finding]) -> pl.DataFrame:
    """The findings as `analyze`'s findings section: one row each, in their order."""
    return pl.DataFrame([x.as_dict() for x in found], schema=SCHEMA)


def flat_view(df: pl.DataFrame) -> pl.DataFrame:
    """The findings as one flat table (csv, xlsx, html): the ranges as low / high columns, the
    evidence as text."""
    rows = flat_rows(df.to_dicts())
    types = {c: pl.String for c in FLAT_COLUMNS} | {c: pl.Float64 for c in FLAT_COLUMNS if c.endswith(("_us", "_pct"))}
    return pl.DataFrame(rows, schema={**types, "rank": pl.Int64})
