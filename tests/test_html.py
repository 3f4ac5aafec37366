"""The report in a browser (`--format html`, pipeline.render.html): one self-contained page per
report, read back as a script would (its sections and `data-value` cells) and, where Chromium is
installed, loaded in headless Chromium (no console error, every chart drawn, hostile names inert)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from pipeline import report as rp
from pipeline import synthetic as synth
from pipeline.analyses import registry
from pipeline.dataset.batch import run_batch
from pipeline.flatten import flatten
from pipeline.render.html import analysis_html, diff_html, frames_html, runs_html
from pipeline.render.html.cells import cell, duration
from pipeline.render.html.escape import script_json, text
from pipeline.runs import sections as run_sections
from pipeline.runs.report import analyze_runs

PAYLOAD = (
    '<img id="pwned" src="x" onerror="document.body.setAttribute(\'data-pwned\',1)">'
    '</script><script>document.body.setAttribute("data-pwned",2)</script><!-- \u2028'
)
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?(?:https?:)?//|@import""", re.I)


class Dom(HTMLParser):
    """A page read as a script reads it: its data-section names, each section's table rows (cells'
    data-value), its chart specs and its inline scripts."""

    def __init__(self, html: str):
        super().__init__()
        self.sections: list[str] = []
        self.rows: dict[str, list[list[str]]] = {}
        self.specs: list[dict] = []
        self.scripts: list[str] = []
        self._stack: list[str | None] = []
        self._row: list[str] | None = None
        self._script: dict | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._stack.append(a.get("data-section"))
            if a.get("data-section"):
                self.sections.append(a["data-section"])
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._row.append(a.get("data-value"))
        elif tag == "script":
            self._script = {"type": a.get("type"), "text": ""}

    def handle_data(self, data):
        if self._script is not None:
            self._script["text"] += data

    def handle_endtag(self, tag):
        if tag == "section":
            self._stack.pop()
        elif tag == "tr" and self._row is not None:
            name = next((s for s in reversed(self._stack) if s), None)
            self.rows.setdefault(name, []).append(self._row)
            self._row = None
        elif tag == "script" and self._script is not None:
            if self._script["type"] == "application/json":
                self.specs.append(json.loads(self._script["text"]))
            else:
                self.scripts.append(self._script["text"])
            self._script = None


def body_rows(html: str, section: str) -> list[list[str]]:
    """The data-value of each <td> of the section's tables (rows of <th> left out)."""
    out, inside, depth = [], False, 0
    for m in re.finditer(r"<section([^>]*)>|</section>|<tr>(.*?)</tr>", html, re.S):
        if m.group(0).startswith("<section"):
            depth += 1
            if f'data-section="{section}"' in (m.group(1) or ""):
                inside, depth = True, 1
        elif m.group(0) == "</section>":
            depth -= 1
            if inside and depth == 0:
                inside = False
        elif inside and "<td" in m.group(2):
            out.append(re.findall(r'<td[^>]*data-value="([^"]*)"', m.group(2)))
    return out


def unescape(v: str) -> str:
    import html

    return html.unescape(v)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A small realistic trace (the bundled example's generator), flattened once."""
    tmp = tmp_path_factory.mktemp("demo")
    synth.write_demo(tmp / "demo.json.gz", 0.6)
    return rp.Flat(flatten(tmp / "demo.json.gz", tmp / "flat").out_dir)


@pytest.fixture(scope="module")
def demo_page(demo):
    sections = rp.analyze(demo)
    return sections, rp.format_analysis(demo, sections, "html")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A trace whose kernel, op and annotation names hold markup meant to run in the page."""
    tmp = tmp_path_factory.mktemp("hostile")
    synth.write_demo(tmp / "demo.json.gz", 0.2)
    with gzip.open(tmp / "demo.json.gz", "rt") as f:
        d = json.load(f)
    wrappers = {"aten::linear", "aten::layer_norm"}  # ops renamed: their children keep their FLOP formulas
    for e in d["traceEvents"]:
        if e.get("cat") == "kernel" or e.get("cat") == "cpu_op" and e.get("name") in wrappers:
            e["name"] = e["name"] + PAYLOAD
    with gzip.open(tmp / "hostile.json.gz", "wt") as f:
        json.dump(d, f)
    f = rp.Flat(flatten(tmp / "hostile.json.gz", tmp / "flat").out_dir)
    return rp.format_analysis(f, rp.analyze(f), "html")


# ------------------------------------------------------------------ escaping
def test_text_escapes_markup_and_both_quotes():
    assert text('<a href="x">\'&') == "&lt;a href=&quot;x&quot;&gt;&#39;&amp;"


def test_script_json_cannot_close_its_script_and_round_trips():
    data = {"name": PAYLOAD, "n": float("nan"), "ok": [1, 2.5]}
    out = script_json(data)
    for bad in ("</script", "<!--", "<", ">", "\u2028", "\u2029"):
        assert bad not in out
    assert json.loads(out) == {"name": PAYLOAD, "n": None, "ok": [1, 2.5]}


# ------------------------------------------------------------------ cells
def test_cells_show_units_and_carry_the_whole_value():
    assert duration(12789.918) == "12.79 ms" and duration(0.88) == "0.880 µs" and duration(2.5e6) == "2.500 s"
    c = cell(12789.918, "dur_us")
    assert (c.text, c.value) == ("12.79 ms", "12789.918")
    assert (
        cell(28.16, "pct").share == 28.16 and cell(28.16, "pct").text == "28.2%" and cell(0.01, "x_pct").text == "<0.1%"
    )
    assert cell(2_090_000_000, "peak_allocated_bytes").text == "2.09 GB"
    assert cell(5.51e12, "flops").text == "5.51 T"
    assert cell(1025.4, "achieved_gbps").text == "1.025 TB/s"
    assert cell(1706, "gaps").text == "1,706"
    long = "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, float, float>>(int)"
    c = cell(long, "name")
    assert c.cut and c.value == long and len(c.text) <= 64
    seq = cell(["a", "b"], "kernels")
    assert seq.lines == ("a", "→ b") and json.loads(seq.value) == ["a", "b"]
    assert cell(None, "dur_us").value == "" and cell(float("nan"), "dur_us").value == ""


# ------------------------------------------------------------------ the analysis page
def test_analysis_page_holds_every_section_and_row_of_the_json(demo, demo_page):
    sections, html = demo_page
    doc = json.loads(rp.format_analysis(demo, sections, "json"))
    dom = Dom(html)
    want = {k for k, v in doc.items() if isinstance(v, list) and v}
    want |= {k for d in doc["devices"] for k, v in d.items() if isinstance(v, list) and v}
    assert want and want <= set(dom.sections), want - set(dom.sections)
    ops = {(o["name"], str(o["calls"])) for o in doc["ops"]}
    assert ops == {(unescape(r[0]), r[1]) for r in body_rows(html, "ops")}
    kernels = {(k["name"], repr(k["dur_us"])) for d in doc["devices"] for k in d["kernels"]}
    rows = body_rows(html, "kernels")
    assert len(rows) == len(kernels) and kernels == {(unescape(r[0]), r[3]) for r in rows}


def test_analysis_page_is_self_contained_and_its_script_allowed_by_hash(demo_page):
    _, html = demo_page
    assert not EXTERNAL.findall(html)
    csp = unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1))
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp.split("script-src")[1]
    (script,) = Dom(html).scripts
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp


def test_analysis_overview_answers_where_the_time_goes(demo_page):
    sections, html = demo_page
    dom = Dom(html)
    titles = [s["title"] for s in dom.specs]
    assert any(t.startswith("Where the time goes") for t in titles)
    assert any(t.startswith("Roofline") for t in titles)
    assert any(t.startswith("What is costed") for t in titles)
    assert any(t.startswith("Why the device sat idle") for t in titles)  # an NPU's too: not "GPU"
    assert re.search(r"Top \d+ kernels by time", html) and re.search(r"Top \d+ CPU ops by self device time", html)
    cats = next(s for s in dom.specs if s["title"].startswith("Where the time goes"))
    total = sections["categories"]["dur_us"].sum()
    assert sum(r["values"][0] for r in cats["rows"]) == pytest.approx(total)
    roof = next(s for s in dom.specs if s["title"].startswith("Roofline"))
    assert roof["points"] and all(p["tip"][0] for p in roof["points"])  # a point names its kernel
    assert roof["x"]["log"] and roof["y"]["log"] and roof["lines"]


def test_a_section_added_to_the_registry_appears_on_the_page(demo, monkeypatch):
    extra = registry.Section(
        "launches-per-op",
        lambda f, o: pl.DataFrame(),
        "Launches per op: a section the page never heard of",
        "help line",
    )
    monkeypatch.setitem(registry.BY_NAME, extra.name, extra)
    sections = {"kernels": rp.analyze(demo, only=["kernels"])["kernels"]}
    sections[extra.name] = pl.DataFrame({"op": ["aten::mm", "aten::add"], "launches": [3, 1]})
    html = analysis_html(demo, sections, {})
    assert 'data-section="launches-per-op"' in html and "Launches per op: a section" in html and "help line" in html
    assert body_rows(html, "launches-per-op") == [["aten::mm", "3"], ["aten::add", "1"]]


def test_empty_sections_are_named_not_dropped(demo_page):
    sections, html = demo_page
    empty = [k for k, v in sections.items() if not v.height]
    assert empty, "the demo trace has sections with nothing (compile, communication)"
    line = re.search(r'<p class="empty">(.*?)</p>', html).group(1)
    assert all(registry.BY_NAME[k].key in line for k in empty)


def test_top_cuts_the_page_like_the_json(demo):
    sections = rp.analyze(demo, only=["kernels", "ops"])
    html = rp.format_analysis(demo, sections, "html", top=3)
    assert len(body_rows(html, "kernels")) <= 3 * sections["kernels"]["device"].n_unique()
    assert len(body_rows(html, "ops")) == 3


# ------------------------------------------------------------------ hostile names
def test_hostile_names_reach_the_page_only_as_text(hostile):
    assert "pwned" in hostile  # the names are there...
    assert '<img id="pwned"' not in hostile and "</script><script>" not in hostile  # ...as text only
    assert hostile.count("<script>") == 1 and "<!-- " not in hostile.split("<body>")[1]
    data = re.findall(r'<script type="application/json" class="chart-spec">(.*?)</script>', hostile, re.S)
    assert data and all("<" not in d and "\u2028" not in d for d in data)
    names = [p["tip"][0] for d in data for p in json.loads(d).get("points", [])]
    assert any(PAYLOAD in n for n in names)  # a roofline point names the hostile kernel, whole


# ------------------------------------------------------------------ the run page and diff page
def test_run_page_holds_every_rank_and_a_heat_map(run_report):
    html = runs_html(run_report)
    dom = Dom(html)
    assert {"runs", "ranks", "stragglers", "collectives", "steps"} <= set(dom.sections)
    assert [r[0] for r in body_rows(html, "ranks")] == ["0", "1", "2", "3"]  # the rank first (one run: no run column)
    heat = next(s for s in dom.specs if s["kind"] == "heatmap")
    assert heat["rows"] == ["0", "1", "2", "3"] and len(heat["values"][0]) == len(heat["cols"])
    assert any(s["kind"] == "scatter" and s["title"].startswith("Bus bandwidth") for s in dom.specs)
    assert "worst straggler" in html and "rank 2" in html


def test_a_run_section_added_to_the_run_report_appears(run_report, monkeypatch):
    extra = ("rank-files", "Rank files: a section the page never heard of", "ranks", ["rank", "trace"])
    monkeypatch.setattr(run_sections, "SECTIONS", (*run_sections.SECTIONS, extra))
    import pipeline.render.html.runs as runs_page

    monkeypatch.setattr(runs_page, "SECTIONS", run_sections.SECTIONS)
    html = runs_html(run_report)
    assert 'data-section="rank-files"' in html and "Rank files: a section the page never heard of" in html
    assert len(body_rows(html, "rank-files")) == 4


def test_diff_page_shows_the_biggest_changes(demo):
    d = rp.diff(demo, demo)
    html = diff_html(d, "before", "after")
    dom = Dom(html)
    assert dom.sections == ["rows"] and len(body_rows(html, "rows")) == d.height
    (bars,) = [s for s in dom.specs if s["kind"] == "bars"]
    assert bars["signed"] and len(bars["rows"]) == min(20, d.height)


def test_frames_page_for_any_command():
    html = frames_html("x", "compare", [("rows", "Rows", pl.DataFrame({"name": ["a<b"], "base_us": [1.5]}))])
    assert body_rows(html, "rows") == [["a&lt;b", "1.5"]] and "a<b" not in html


# ------------------------------------------------------------------ the command line
def test_cli_writes_html_for_analyze_diff_and_ranks(demo, run_report, tmp_path, run_cli):
    r = run_cli(["analyze", demo.path, "--format", "html", "-o", tmp_path / "a.html"])
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "a.html").read_text().startswith("<!DOCTYPE html>")
    r = run_cli(["diff", demo.path, demo.path, "-f", "html", "-o", tmp_path / "d.html"])
    assert r.returncode == 0, r.stderr
    assert 'data-section="rows"' in (tmp_path / "d.html").read_text()
    r = run_cli(["analyze", demo.path, "-f", "htm"])
    assert r.returncode == 2 and "html" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ in a browser
def chromium() -> str:
    for c in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(c):
            return shutil.which(c)  # type: ignore[return-value]
    pytest.skip("no Chromium (Debian: apt-get install chromium)")
    return ""


def in_browser(path: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and the console's errors."""
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=10000",
                "--dump-dom",
                path.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    errors = [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln and ("rror" in ln or "Uncaught" in ln)]
    return p.stdout, errors


def test_pages_load_in_chromium_without_errors_and_draw_every_chart(demo_page, run_report, demo, tmp_path):
    from pipeline.render.html.compare import comparison_html, trend_html

    pages = {
        "analysis": demo_page[1],
        "run": runs_html(run_report),
        "diff": diff_html(rp.diff(demo, demo), "a", "b"),
        "comparison": comparison_html(COMPARISON),
        "trend": trend_html(TREND),
    }
    for name, html in pages.items():
        path = tmp_path / f"{name}.html"
        path.write_text(html)
        dom, errors = in_browser(path)
        assert not errors, (name, errors)
        main = dom.split("<main>")[1].split("</main>")[0]
        assert main.count("<svg") == len(Dom(html).specs) and "could not be drawn" not in main, name


def test_hostile_names_do_not_run_in_chromium(hostile, tmp_path):
    path = tmp_path / "hostile.html"
    path.write_text(hostile)
    dom, errors = in_browser(path)
    assert "data-pwned" not in dom.split("<body")[1].split(">")[0]
    assert '<img id="pwned"' not in dom and "pwned" in dom
    assert not errors


PROBE = """
document.addEventListener("DOMContentLoaded", function () {
  var out = {};
  var table = document.querySelector('section[data-section="kernels"] table');
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var dur = heads.findIndex(function (th) { return th.getAttribute("data-value") === "dur_us"; });
  var first = function () { return +table.tBodies[0].rows[0].cells[dur].getAttribute("data-value"); };
  heads[dur].click();
  out.descending = first();
  heads[dur].click();
  out.ascending = first();
  var filter = document.querySelector('section[data-section="ops"] input.filter');
  filter.value = "aten::mm";
  filter.dispatchEvent(new Event("input", { bubbles: true }));
  var pad = document.querySelector('section[data-section="queue"] svg rect[cursor="crosshair"]');
  var r = pad.getBoundingClientRect();
  var at = function (type, f) {
    pad.dispatchEvent(new MouseEvent(type, { clientX: r.left + r.width * f, clientY: r.top + 20, bubbles: true }));
  };
  at("mousedown", 0.2); at("mousemove", 0.5); at("mouseup", 0.5);
  out.zoomed = !!document.querySelector('section[data-section="queue"] .plot button');
  var point = document.querySelector("#overview circle");
  var p = point.getBoundingClientRect();
  point.dispatchEvent(new MouseEvent("mousemove", { clientX: p.left + 1, clientY: p.top + 1, bubbles: true }));
  out.tip = document.getElementById("tip").textContent;
  setTimeout(function () {
    out.count = document.querySelector('section[data-section="ops"] .count').textContent;
    out.shown = document.querySelectorAll('section[data-section="ops"] tbody tr:not(.hidden)').length;
    document.body.setAttribute("data-probe", JSON.stringify(out));
  }, 500);
});
"""


def test_tables_sort_and_filter_timelines_zoom_points_name_their_kernel(demo, demo_page, tmp_path, monkeypatch):
    """The page's scripts at work in Chromium: a probe script (allowed by its own hash) clicks a
    header twice, types in a filter box, drags across a timeline and hovers a roofline point."""
    from pipeline.render.html import table

    monkeypatch.setattr(table, "FILTER_ROWS", 2)  # the demo's ops table is short: give it a filter box
    sections = demo_page[0]
    html = rp.format_analysis(demo, sections, "html")
    digest = base64.b64encode(hashlib.sha256(PROBE.encode()).digest()).decode()
    probed = html.replace("script-src ", f"script-src &#39;sha256-{digest}&#39; ", 1)
    probed = probed.replace("</body>", f"<script>{PROBE}</script></body>")
    path = tmp_path / "probed.html"
    path.write_text(probed)
    dom, errors = in_browser(path)
    assert not errors
    import html as html_mod

    probe = json.loads(html_mod.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    durations = sections["kernels"]["dur_us"]
    assert probe["descending"] == pytest.approx(durations.max()) and probe["ascending"] == pytest.approx(
        durations.min()
    )
    matching = sections["ops"].filter(pl.col("name").str.contains("aten::mm", literal=True)).height
    assert probe["shown"] == matching and probe["count"] == f"{matching} of {sections['ops'].height} rows"
    assert probe["zoomed"]
    kernels = set(sections["kernels"]["name"])
    assert probe["tip"].split("\n")[0] in kernels or any(probe["tip"].startswith(k) for k in kernels)


@pytest.mark.real
@pytest.mark.slow
def test_real_trace_page_holds_its_json_and_loads(shared_traces, tmp_path, run_cli):
    """A real H100 trace (Qwen1.5-0.5B): every list of its JSON document a section of the page,
    every op and kernel row there; its memory timeline marks the peak the memory section reports."""
    trace = shared_traces / "tracelens" / "h100_qwen1.5_0.5b.json.gz"
    page = tmp_path / "h100.html"
    assert run_cli(["analyze", trace, "-f", "html", "-o", page]).returncode == 0
    doc = json.loads(run_cli(["analyze", trace, "-f", "json"]).stdout)
    html = page.read_text()
    dom = Dom(html)
    want = {k for k, v in doc.items() if isinstance(v, list) and v} | {"kernels", "critical_path"}
    assert want <= set(dom.sections)
    assert {(o["name"], str(o["calls"])) for o in doc["ops"]} == {(r[0], r[1]) for r in body_rows(html, "ops")}
    assert len(body_rows(html, "kernels")) == sum(len(d["kernels"]) for d in doc["devices"])
    (memory,) = [s for s in dom.specs if s["kind"] == "lines" and s["title"].startswith("Memory")]
    peak = next(m for m in doc["memory"] if m["device"] == 0)
    assert memory["marks"][0]["y"] == peak["peak_allocated_bytes"]
    assert max(memory["series"][0]["y"]) == peak["peak_allocated_bytes"]
    _, errors = in_browser(page)
    assert not errors


def test_a_json_document_as_a_page():
    """Any command's JSON document: lists of records as sections under their keys, the rest facts."""
    from pipeline.render.html import document_html

    doc = {
        "base": {"run": "nightly-1", "ranks": 8},
        "problems": ["rank 3 truncated"],
        "rows": [{"level": "kernel", "name": "gemm<x>", "delta_pct": 12.5}, {"level": "op", "name": "aten::mm"}],
        "empty": [],
    }
    html = document_html("nightly-1 vs nightly-2", "compare", doc)
    assert Dom(html).sections == ["rows"] and "Nothing to show in this input: empty" in html
    assert body_rows(html, "rows") == [["kernel", "gemm&lt;x&gt;", "12.5"], ["op", "aten::mm", ""]]
    assert "base.run" in html and "nightly-1" in html and "rank 3 truncated" in html


def test_sentences_wrap_and_names_shorten():
    why = "the op that launched it has no FLOP formula: add one in a formulas file and pass --formulas FILE.toml"
    c = cell(why, "why")
    assert c.prose and c.text == why and not c.cut
    name = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1>>(int)"
    )
    assert not cell(name, "name").prose and cell(name, "name").cut


def test_what_is_costed_comes_from_the_coverage_section_else_the_roofline(demo, demo_page):
    sections, html = demo_page
    cov = sections["coverage"]
    costed = cov.filter(pl.col("cause").str.starts_with("costed:"))["pct"].sum()
    spec = next(s for s in Dom(html).specs if s["title"] == "What is costed: % of kernel time")
    assert sum(
        v for r in spec["rows"] for v, s in zip(r["values"], spec["series"]) if s["name"].startswith("costed")
    ) == (pytest.approx(costed))
    without = {k: v for k, v in sections.items() if k != "coverage"}
    dom = Dom(analysis_html(demo, without, {}))
    assert any(s["title"].startswith("What is costed: % of kernel time with FLOPs and bytes") for s in dom.specs)


COMPARED = [
    {"level": "kernel", "name": "gemm<x>", "verdict": "regressed", "delta_pct": 20.0, "base_us": 10.0, "new_us": 12.0},
    {"level": "kernel", "name": "relu", "verdict": "same", "delta_pct": 1.0, "base_us": 5.0, "new_us": 5.05},
    {"level": "op", "name": "aten::mm", "verdict": "improved", "delta_pct": -9.0, "base_us": 9.0, "new_us": 8.2},
]
COMPARISON = {
    "base": {"run": "n1", "ranks": 8},
    "new": {"run": "n2", "ranks": 8},
    "method": {"fdr": 0.01},
    "problems": ["rank 3 of n2 truncated"],
    "rows": COMPARED,
}
TREND = {
    "level": "kernel",
    "rows": [{"run": f"r{i}", "label": f"r{i}", "name": "gemm", "value_us": v} for i, v in enumerate([10, 10, 14])],
    "change_points": [{"name": "gemm", "run": "r2", "label": "r2", "delta_pct": 40.0}],
}


def test_comparison_and_trend_pages_from_their_documents():
    from pipeline.render.html.compare import comparison_html, trend_html

    html = comparison_html(COMPARISON)
    dom = Dom(html)
    assert dom.sections == ["rows"] and len(body_rows(html, "rows")) == 3
    assert "<h4>Kernels</h4>" in html and "<h4>Ops</h4>" in html and "rank 3 of n2 truncated" in html
    (bars,) = [s for s in dom.specs if s["kind"] == "bars"]
    assert [r["full"] for r in bars["rows"]] == ["kernel: gemm<x>", "op: aten::mm"]  # the changes, largest first
    dom = Dom(trend_html(TREND))
    assert {"rows", "change_points"} <= set(dom.sections)
    (line,) = [s for s in dom.specs if s["kind"] == "lines"]
    assert line["x"]["labels"] == ["r0", "r1", "r2"] and line["marks"][0]["x"] == 2


def test_a_time_per_something_is_a_time():
    assert cell(6326.31, "gpu_us_per_replay").text == "6.326 ms"
    assert cell(3.0, "tokens_per_s").text == "3.00"  # a rate, not a time


def test_run_problems_are_said_first_and_in_their_section(tmp_path):
    synth.write_run(tmp_path / "run", 4, 16, straggler=2, delay_us=800.0, delayed=3)
    (tmp_path / "run" / "notes.json").write_text('{"note": "<b>not a trace</b>"}')
    html = runs_html(analyze_runs(tmp_path / "run"))
    assert 'data-section="problems"' in html
    problems = body_rows(html, "problems")
    assert any(r[0] == "notes.json" for r in problems)
    overview = html.split('id="overview"')[1].split("</section>")[0]
    assert "<span>problems</span><b>1</b>" in overview and "notes.json" in overview


def test_compare_and_trend_write_pages(tmp_path, run_cli):
    from pipeline.synthetic.regression import write_runs

    truth = write_runs(tmp_path / "arch", runs=3, world=2, steps=2, kernels=6, changes={1: (2, 1.5)})
    run_batch(tmp_path / "arch", tmp_path / "ds", jobs=1)
    r = run_cli(
        ["compare", tmp_path / "ds", "--base", "run01", "--new", "run02", "-f", "html", "-o", tmp_path / "c.html"]
    )
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "c.html").read_text()
    doc = json.loads(run_cli(["compare", tmp_path / "ds", "--base", "run01", "--new", "run02", "-f", "json"]).stdout)
    assert len(body_rows(html, "rows")) == len(doc["rows"])
    assert list(truth["changed"])[0] in unescape(html)  # the changed kernel, whole, in a data-value
    r = run_cli(["trend", tmp_path / "ds", "-f", "html", "-o", tmp_path / "t.html"])
    assert r.returncode == 0, r.stderr
    assert any(s["kind"] == "lines" for s in Dom((tmp_path / "t.html").read_text()).specs)
