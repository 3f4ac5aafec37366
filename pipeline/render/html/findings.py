"""findings: the "What to fix" block of a page: one card per finding (`data-finding="ID"`), its
saving drawn as a range on the window (and on the device's busy time), its title, its evidence in
a small table, its remedy, how it was estimated, and a link to the section to look at next.

Every text goes through `escape.text`; the only values in a style attribute are the numbers the
ranges are drawn from.
"""

from __future__ import annotations

from pipeline.render.findings import about_the_window, duration, saving_line
from pipeline.render.html.escape import text as esc
from pipeline.render.html.model import Findings
from pipeline.render.tables import shorten

NAME_CHARS = 96  # a name in an evidence table is shortened to this (the whole of it on hover)

NONE = "Nothing to fix found: no finding's premise holds here (see the guide, reading the findings)."


def findings_html(p: Findings) -> str:
    head = f"<h4>run {esc(p.run)}</h4>" if p.run else ""
    if not p.rows:
        return head + f'<p class="note">{esc(p.none or NONE)}</p>'
    cards = "".join(_card(i, d, p) for i, d in enumerate(p.rows, 1))
    return head + f'<ol class="findings">{cards}</ol>'


def _bar(r: list | None, whole: float | None, label: str, kind: str) -> str:
    """A range [low, high] drawn on a track of `whole` (µs)."""
    if not r or not whole:
        return ""
    lo, hi = (max(0.0, min(100.0, 100 * v / whole)) for v in r)
    return (
        f'<div class="frange {kind}" title="{esc(label)}"><span class="track">'
        f'<span class="lo" style="width:{lo:.2f}%"></span>'
        f'<span class="hi" style="left:{lo:.2f}%;width:{max(hi - lo, 0.4):.2f}%"></span></span>'
        f"<small>{esc(label)}</small></div>"
    )


def _card(i: int, d: dict, p: Findings) -> str:
    fid = str(d["id"])
    window = d.get("window_us")
    share = d.get("gain_pct")
    wall = saving_line(d, p.window)
    scale = f"{share[0]:.1f}-{share[1]:.1f}% of {p.window} ({duration(window)})" if share and window else ""
    bars = "" if about_the_window(d) else _bar(d["gain_us"], window, scale, "wall")
    rows = "".join(_evidence_row(e) for e in d.get("evidence") or [])
    evidence = (
        '<table class="evidence"><thead><tr><th>what</th><th>name</th><th>count</th><th>time</th>'
        f"<th>share</th><th>note</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else ""
    )
    target = p.links.get(d.get("section"))
    section = str(d.get("section") or "")
    nxt = f'<a href="#{esc(target)}">look next: {esc(section)}</a>' if target else f"look next: {esc(section)}"
    return (
        f'<li class="finding" data-finding="{esc(fid)}" id="finding-{i}">'
        f'<div class="fhead"><b>{esc(fid)}</b><span>{esc(wall)}</span></div>'
        f"{bars}"
        f'<p class="ftitle">{esc(d["title"])}</p>'
        f"{evidence}"
        f'<p class="fix"><b>Fix:</b> {esc(d["remedy"])}</p>'
        f'<p class="fnext">{nxt} · <span title="how the range was estimated">{esc(d.get("basis") or "")}</span></p>'
        "</li>"
    )


def _evidence_row(e: dict) -> str:
    name = str(e.get("name") or "")
    count = "" if e.get("count") is None else f"{e['count']:,}"
    share = "" if e.get("pct") is None else f"{e['pct']:.1f}% of {e.get('pct_of') or '?'}"
    cells = (e.get("what") or "", count, duration(e.get("time_us")), share, e.get("note") or "")
    return (
        f"<tr><td>{esc(cells[0])}</td>"
        f'<td class="t" title="{esc(name)}">{esc(shorten(name, NAME_CHARS, names=e.get("what") != "chain"))}</td>'
        + "".join(f"<td>{esc(c)}</td>" for c in cells[1:])
        + "</tr>"
    )
