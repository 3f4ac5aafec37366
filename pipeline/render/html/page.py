"""page: a `Page` (`model`) as one self-contained HTML file.

Everything is inline: the style sheet (`page.css`), the scripts (`tables.js`, `charts.js`, in this
package) and each chart's data (JSON in `<script type="application/json">`, escaped by
`escape.script_json`). The file loads nothing: its Content-Security-Policy allows no network
at all, inline styles, and only its own script, by hash (so markup that got into a name could not
run even if an escape were missed). It opens from `file://`, an e-mail or a CI artifact.

Layout: a heading with the input's facts, a bar of links to the sections, what to fix (the lead
sections: the findings), the overview (tiles, then charts and small tables in a grid), then every
section (`<section data-section="NAME">`), and a line naming the sections that had nothing to show.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib.resources import files

from pipeline.render.html.cells import NAME_CHARS
from pipeline.render.html.escape import script_json
from pipeline.render.html.escape import text as esc
from pipeline.render.html.findings import findings_html
from pipeline.render.html.model import Chart, Findings, Group, Note, Page, Part, Section, Table, Tile
from pipeline.render.html.table import html_table

COMPACT_NAMES = 48  # characters of a name in an overview's table
LONG_TILE = 11  # characters: a longer tile value is written smaller
SCRIPTS = ("tables.js", "charts.js")  # in this order, as one inline script
STYLE = "page.css"


@cache
def asset(name: str) -> str:
    """A file shipped in this package (the style sheet, a script)."""
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def script() -> tuple[str, str]:
    """(the page's one script, its CSP source: 'sha256-...')."""
    js = "\n".join(asset(n) for n in SCRIPTS)
    digest = base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()
    return js, f"'sha256-{digest}'"


def policy(script_source: str) -> str:
    """Nothing from anywhere; inline style; the page's own script; data: images (the empty icon)."""
    return f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src {script_source}"


def anchor(name: str) -> str:
    return "s-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name)


def render_page(page: Page, empty: list[tuple[str, str]] | None = None) -> str:
    """The page as HTML text. `empty`: (name, title) of the sections that had no rows, named at
    the end (so a reader knows they were looked at)."""
    from pipeline.version import __version__

    js, source = script()
    sections = [s for s in page.sections if s.parts]
    for s in sections:
        s.anchor = s.anchor or anchor(s.name or s.title)
    lead = [s for s in sections if s.lead]
    rest = [s for s in sections if not s.lead]
    link = lambda s: f'<a href="#{esc(s.anchor)}">{esc(_short_title(s.title))}</a>'
    links = [link(s) for s in lead] + (['<a href="#overview">Overview</a>'] if page.overview else [])
    links += [link(s) for s in rest]
    facts = "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(v)}</dd></div>" for k, v in page.facts)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{esc(policy(source))}">',
        f'<meta name="generator" content="tracepipe {esc(__version__)}">',
        f"<title>{esc(page.title)} · tracepipe {esc(page.kind)}</title>",
        '<link rel="icon" href="data:,">',
        f"<style>{asset(STYLE)}</style></head>",
        "<body>",
        f'<header class="top"><div class="brand">tracepipe <span>{esc(page.kind)}</span></div>'
        f'<h1>{esc(page.title)}</h1><dl class="facts">{facts}</dl></header>',
        f'<nav class="toc">{"".join(links)}</nav>',
        "<main>",
    ]
    out += [_section(s) for s in lead]
    if page.overview:
        out.append(f'<section id="overview" class="overview"><h2>Overview</h2>{_overview(page.overview)}</section>')
    out += [_section(s) for s in rest]
    if empty:
        names = ", ".join(f"{n} ({t})" if t and t != n else n for n, t in empty)
        out.append(f'<p class="empty">Nothing to show in this input: {esc(names)}.</p>')
    out += [
        "</main>",
        f"<footer>tracepipe {esc(__version__)} · one self-contained file: it loads nothing from the network; "
        "click a column to sort, type in a table's box to filter its rows (words must all match, "
        "-word excludes), hover a shortened name for the whole of it; drag across a timeline to zoom, "
        "double-click to zoom out.</footer>",
        f"<script>{js}</script>",
        "</body></html>",
    ]
    return "\n".join(out) + "\n"


def _short_title(title: str) -> str:
    """A section's title in the bar of links: up to its first colon."""
    return title.split(":")[0].strip()


def _overview(parts: list[Part]) -> str:
    tiles = [p for p in parts if isinstance(p, Tile)]
    rest = [p for p in parts if not isinstance(p, Tile)]
    out = f'<div class="tiles">{"".join(_tile(t) for t in tiles)}</div>' if tiles else ""
    cells = []
    for p in rest:
        wide = isinstance(p, (Note, Table)) or isinstance(p, Chart) and p.wide
        cells.append(f'<div class="cell{" wide" if wide else ""}">{_part(p)}</div>')
    return out + f'<div class="grid">{"".join(cells)}</div>'


def _section(s: Section) -> str:
    data = f' data-section="{esc(s.name)}"' if s.name else ""
    data += ' class="lead"' if s.lead else ""
    help_line = f'<p class="help">{esc(s.help)}</p>' if s.help else ""
    return (
        f'<section{data} id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>{help_line}'
        f"{''.join(_part(p) for p in s.parts)}</section>"
    )


def _tile(t: Tile) -> str:
    tone = f" {t.tone}" if t.tone else ""
    tone += " long" if len(t.value) > LONG_TILE else ""
    note = f"<small>{esc(t.note)}</small>" if t.note else ""
    return f'<div class="tile{tone}"><span>{esc(t.label)}</span><b>{esc(t.value)}</b>{note}</div>'


def _part(p: Part) -> str:
    if isinstance(p, Table):
        return html_table(p.frame, p.caption, COMPACT_NAMES if p.compact else NAME_CHARS, p.compact, p.meanings)
    if isinstance(p, Chart):
        title = p.spec.get("title", "")
        note = p.spec.get("note")
        full = f' title="{esc(p.spec["full"])}"' if p.spec.get("full") else ""
        return (
            f'<figure class="chart"><figcaption{full}>{esc(title)}</figcaption><div class="plot"></div>'
            f'<script type="application/json" class="chart-spec">{script_json(p.spec)}</script>'
            + (f'<p class="note">{esc(note)}</p>' if note else "")
            + "</figure>"
        )
    if isinstance(p, Note):
        return f'<p class="note{" " + p.tone if p.tone else ""}">{esc(p.text)}</p>'
    if isinstance(p, Tile):
        return _tile(p)
    if isinstance(p, Group):
        return "".join(_part(q) for q in p.parts)
    if isinstance(p, Findings):
        return findings_html(p)
    raise TypeError(f"not a part of a page: {type(p).__name__}")
