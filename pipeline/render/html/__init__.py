"""html: a report as one self-contained HTML page (`--format html`), for every command.

    model      what a page is: facts, an overview, sections of tables, charts, tiles, notes
    page       a page as HTML: inline style, script and data, a Content-Security-Policy
    table      a frame as a sortable, filterable table, each cell's whole value in data-value
    cells      one value as a cell: its text (units, shortened names) and its whole value
    charts     the data of the charts (bars, scatter, lines, heat map), drawn by charts.js
    escape     text and script data made safe (a trace is untrusted text)
    analysis   the page of `analyze` (+ `overview`, `costing`): from the analyses registry
    runs       the page of `ranks`: from the run sections
    diff       the page of `diff`
    compare    the pages of `compare` and `trend`, from their JSON documents
    frames     a page of named tables, or of any JSON document, for any other command

The style sheet and scripts (`page.css`, `tables.js`, `charts.js`) are files of this package,
written by hand: no charting library, no build step, nothing fetched.
"""

from pipeline.render.html.analysis import analysis_html
from pipeline.render.html.compare import comparison_html, trend_html
from pipeline.render.html.diff import diff_html
from pipeline.render.html.frames import document_html, frames_html
from pipeline.render.html.model import Chart, Note, Page, Section, Table, Tile
from pipeline.render.html.page import render_page
from pipeline.render.html.runs import runs_html

__all__ = [
    "Chart",
    "Note",
    "Page",
    "Section",
    "Table",
    "Tile",
    "analysis_html",
    "comparison_html",
    "diff_html",
    "document_html",
    "frames_html",
    "render_page",
    "runs_html",
    "trend_html",
]
