"""frames: a page of named tables, for a command that has no page of its own yet (or whose page
is its tables): each (name, title, frame or {caption: frame}) a `<section data-section="NAME">`.
A command gets `--format html` by building its frames and calling `frames_html`; it may add an
overview (tiles, charts) and charts per section. `document_html` makes the page of a JSON
document as it is: each list of records a section under its key, the other values facts.
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


def document_frames(doc: Mapping) -> tuple[list[tuple[str, str, pl.DataFrame]], list[tuple[str, str]]]:
    """(sections, facts) of a JSON document: each list of records a section (its key, every
    record a row), each other value a fact (nested keys joined with '.', lists of scalars by ', ')."""
    sections: list[tuple[str, str, pl.DataFrame]] = []
    facts: list[tuple[str, str]] = []

    def fact(key: str, v: object) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                fact(f"{key}.{k}" if key else str(k), x)
        elif isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
            sections.append((key, key.replace("_", " "), pl.DataFrame(v, infer_schema_length=None)))
        elif isinstance(v, list):
            facts.append((key, ", ".join("" if x is None else str(x) for x in v)))
        elif v is not None:
            facts.append((key, str(v)))

    for k, v in doc.items():
        if isinstance(v, list) and (not v or all(isinstance(x, Mapping) for x in v)):
            rows = pl.DataFrame(v, infer_schema_length=None) if v else pl.DataFrame()
            sections.append((str(k), str(k).replace("_", " "), rows))
        else:
            fact(str(k), v)
    return sections, facts


def document_html(title: str, kind: str, doc: Mapping, overview: Iterable[Part] = (), titles=None) -> str:
    """The page of a JSON document (see `document_frames`); `titles`: section titles by key."""
    sections, facts = document_frames(doc)
    named = [(k, (titles or {}).get(k, t), df) for k, t, df in sections]
    return frames_html(title, kind, named, facts, overview)
