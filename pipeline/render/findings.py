"""findings: the findings as a reader meets them first at a terminal (numbered, wrapped to the
width) or in Markdown: each one's saving, title, evidence, remedy and where to look next.

Works on findings as dicts (`Finding.as_dict`, the JSON document's rows), so that `analyze` (a
frame) and `ranks` (per run) write them alike.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from pipeline.render.tables import shorten

if TYPE_CHECKING:
    import polars as pl

EVIDENCE_ROWS = 4  # evidence rows shown per finding in text (json, csv and html hold them all)
NAME_CHARS = 64  # a name in an evidence line is shortened to this (the middle cut, with its id)
NONE = "Nothing to fix found: no finding's premise holds on {} (docs/guides/reading-findings.md)."


def duration(v_us: float | None) -> str:
    if v_us is None:
        return ""
    a = abs(v_us)
    if a >= 1e6:
        return f"{v_us / 1e6:.3g} s"
    if a >= 1e3:
        return f"{v_us / 1e3:.3g} ms"
    return f"{v_us:.0f} µs"


def range_text(r: list | tuple | None) -> str:
    """[low, high] µs as "32.1-60 ms"."""
    if not r:
        return ""
    lo, hi = r
    unit, scale = ("s", 1e6) if hi >= 1e6 else ("ms", 1e3) if hi >= 1e3 else ("µs", 1.0)
    f = (lambda v: f"{v / scale:.3g}") if scale > 1 else (lambda v: f"{v:.0f}")
    return f"{f(lo)}-{f(hi)} {unit}"


def about_the_window(d: dict) -> bool:
    """A finding that saves nothing, neither wall nor device time: it qualifies the window (`warmup`)."""
    return not d["gain_us"][1] and not d.get("gpu_gain_us")


def saving_line(d: dict, window: str = "the window") -> str:
    """What a finding saves: wall time (and its share of the window), device time."""
    gpu = d.get("gpu_gain_us")
    if about_the_window(d):
        return f"saves nothing at run time; it qualifies every share of {window}"
    if gpu and not d["gain_us"][1]:
        return f"frees device time {range_text(gpu)}; no wall time while the host bounds {window}"
    out = f"saves {range_text(d['gain_us'])}"
    if d.get("gain_pct"):
        lo, hi = d["gain_pct"]
        out += f" ({lo:.1f}-{hi:.1f}% of {window})"
    if gpu:
        out += f"; device time {range_text(gpu)}"
        if d["gain_us"][1] < 0.25 * gpu[1]:
            out += " (little wall time while the host bounds the window)"
    return out


def evidence_text(e: dict, limit: int | None = NAME_CHARS) -> str:
    chain = e.get("what") == "chain"  # a chain is read whole (the lines wrap)
    name = shorten(str(e["name"]), limit) if limit and not chain else str(e["name"])
    parts = [name]
    if e.get("count") is not None:
        parts.append(f"x{e['count']:,}")
    if e.get("time_us") is not None:
        parts.append(duration(e["time_us"]))
    if e.get("pct") is not None:
        parts.append(f"({e['pct']:.1f}% of {e['pct_of']})" if e.get("pct_of") else f"({e['pct']:.1f}%)")
    out = " ".join(parts)
    return out + (f", {e['note']}" if e.get("note") else "")


def findings_lines(
    rows: list[dict], fmt: str = "table", width: int | None = None, window: str = "the window", none: str | None = None
) -> str:
    """The findings, numbered, each with its saving (`window`: what its share is of), title,
    evidence, remedy and next section; `none`: what it says without any (default: nothing to fix
    found)."""
    width = max(width or 100, 60)
    if not rows:  # in a table, within the width as the findings are (Markdown wraps itself)
        none = none or NONE.format(window)
        return (none if fmt == "md" else "\n".join(_wrapped(none, width, ""))) + "\n"
    if fmt == "md":
        return "".join(_md(i, d, window) for i, d in enumerate(rows, 1))
    out = []
    for i, d in enumerate(rows, 1):
        head = f"{i:>2}. {d['id']}: {saving_line(d, window)}"
        out += _wrapped(head, width, "", "    ")
        out += _wrapped(d["title"], width, "    ", "    ")
        ev = d.get("evidence") or []
        for j, e in enumerate(ev[:EVIDENCE_ROWS]):
            label = "    evidence: " if j == 0 else "              "
            out += _wrapped(evidence_text(e), width, label, " " * len(label))
        if len(ev) > EVIDENCE_ROWS:
            out.append(f"              ({len(ev) - EVIDENCE_ROWS} more: --format json)")
        out += _wrapped(d["remedy"], width, "    fix: ", "         ")
        out.append(f"    next: --section {d['section']}")
    return "\n".join(out) + "\n"


def _wrapped(text: str, width: int, first: str, rest: str | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent=rest if rest is not None else first,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def _md(i: int, d: dict, window: str) -> str:
    ev = "".join(f"     - {evidence_text(e, None)}\n" for e in d.get("evidence") or [])
    return (
        f"{i}. **{d['id']}**: {saving_line(d, window)}  \n"
        f"   {d['title']}  \n"
        f"   *Fix:* {d['remedy']}  \n"
        f"   *Next:* `--section {d['section']}`; *estimate:* {d.get('basis') or ''}\n"
        + (f"   - evidence:\n{ev}" if ev else "")
    )


def flat_rows(rows: list[dict]) -> list[dict]:
    """The findings as flat rows (csv, xlsx, html tables): the ranges as low / high columns, the
    evidence as one text."""
    out = []
    for i, d in enumerate(rows, 1):
        gain, gpu, share = d["gain_us"], d.get("gpu_gain_us"), d.get("gain_pct") or [None, None]
        out.append(
            {
                "rank": i,
                "id": d["id"],
                "gain_low_us": gain[0],
                "gain_high_us": gain[1],
                "gain_low_pct": share[0],
                "gain_high_pct": share[1],
                "gpu_gain_low_us": gpu[0] if gpu else None,
                "gpu_gain_high_us": gpu[1] if gpu else None,
                "title": d["title"],
                "remedy": d["remedy"],
                "section": d["section"],
                "evidence": "; ".join(evidence_text(e, None) for e in d.get("evidence") or []),
                "basis": d.get("basis") or "",
            }
        )
    return out


FLAT_COLUMNS = (
    "rank",
    "id",
    "gain_low_us",
    "gain_high_us",
    "gain_low_pct",
    "gain_high_pct",
    "gpu_gain_low_us",
    "gpu_gain_high_us",
    "title",
    "remedy",
    "section",
    "evidence",
    "basis",
)


def findings_text(df: pl.DataFrame, fmt: str, width: int | None) -> str:
    """The findings section of `analyze` as text (table) or Markdown."""
    return findings_lines(df.to_dicts(), fmt, width)
