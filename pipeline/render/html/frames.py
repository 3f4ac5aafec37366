"""frames: a page of named tables, for a command that has no page of its own yet (or whose page
is its tables): each (name, title, frame or {caption: frame}) a `<section data-section="NAME">`.
A command gets `--format html` by building its frames and calling `frames_html`; it may add an
overview (tiles, charts) and charts per section.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

from pipeline.render.html.model import Page, Part, Section, Table
from pipeline.render.html.page import render_page

Frames = pl.DataFrame | Mapping[str, pl.DataFrame]


def frames_page(
    title: str,
    kind: str,
    sections: Iterable[tuple[str, str, Frames]],
    facts: Iterable[tuple[str, str]] = (),
    overview: Iterable[Part] = (),
    charts: Mapping[str, list[Part]] | None = None,
    helps: Mapping[str, str] | None = None,
) -> tuple[Page, list[tuple[str, str]]]:
    """(the page, its sections without rows): a section per (name, title, frames); `charts` and
    `helps` by section name: drawn above its tables, and the line under its title."""
    page = Page(title, kind, facts=list(facts), overview=list(overview))
    empty = []
    for name, heading, frames in sections:
        tables = {None: frames} if isinstance(frames, pl.DataFrame) else dict(frames)
        parts: list[Part] = [Table(df, caption) for caption, df in tables.items() if df.height]
        if not parts:
            empty.append((name, heading))
            continue
        sec = Section(heading, name=name, help=(helps or {}).get(name, ""))
        sec.parts = list((charts or {}).get(name, [])) + parts
        page.sections.append(sec)
    return page, empty


def frames_html(
    title: str,
    kind: str,
    sections: Iterable[tuple[str, str, Frames]],
    facts: Iterable[tuple[str, str]] = (),
    overview: Iterable[Part] = (),
    charts: Mapping[str, list[Part]] | None = None,
    helps: Mapping[str, str] | None = None,
) -> str:
    """The page of `frames_page` as HTML text."""
    return render_page(*frames_page(title, kind, sections, facts, overview, charts, helps))
