"""model: what a page is made of, whatever the command: a title, facts about its input, an
overview, then its sections, each a list of parts (tables, charts, tiles, notes).

Every command's page is a `Page` (`analysis`, `runs`, `diff`; a later command builds one the same
way, or calls `frames_page`); `page.render_page` writes any of them. A `Section` with a `name` is
`<section data-section="NAME">`: NAME is the key of that section in the command's JSON document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl


@dataclass(frozen=True)
class Table:
    """A table of every row of `frame` (under `caption` when a section has several)."""

    frame: pl.DataFrame
    caption: str | None = None
    compact: bool = False  # a small table of an overview: no filter box, no scroll box, shorter names
    meanings: dict[str, str] = field(default_factory=dict)  # what a column is (its header's hover: a % of what)


@dataclass(frozen=True)
class Chart:
    """A chart drawn on the page by `charts.js` from `spec` (see `charts`): {"kind": ..., ...}."""

    spec: dict
    wide: bool = False  # the whole width of the overview's grid


@dataclass(frozen=True)
class Tile:
    """One headline number of an overview: its label, its value, a line under it."""

    label: str
    value: str
    note: str = ""
    tone: str = ""  # "", "good", "warn", "bad": the tile's colour


@dataclass(frozen=True)
class Note:
    """A paragraph of text (escaped like everything else)."""

    text: str
    tone: str = ""  # "" or "warn"


@dataclass(frozen=True)
class Group:
    """Parts shown together, one under the other (one cell of the overview's grid)."""

    parts: tuple


@dataclass(frozen=True)
class Findings:
    """What to fix: findings (`Finding.as_dict` rows, largest saving first), each drawn with its
    range, title, evidence, remedy and a link to its section (`links`: section name -> the anchor
    on this page, when the page holds that section)."""

    rows: tuple[dict, ...]
    links: dict = field(default_factory=dict)
    window: str = "the window"  # what gain_pct is a share of
    run: str | None = None  # a run's findings on a page of several runs
    none: str | None = None  # what it says when it holds no finding (default: nothing to fix found)


Part = Table | Chart | Tile | Note | Group | Findings


@dataclass
class Section:
    title: str
    parts: list[Part] = field(default_factory=list)
    name: str | None = None  # its key in the JSON document: data-section="NAME"
    help: str = ""  # a line under the title
    anchor: str = ""  # its id on the page (default: its name)
    lead: bool = False  # shown before the overview (what to fix)


@dataclass
class Page:
    title: str  # the input's name: the page's title and heading
    kind: str  # what it is: "trace analysis", "run", "diff", ...
    facts: list[tuple[str, str]] = field(default_factory=list)  # (label, value) under the heading
    overview: list[Part] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
