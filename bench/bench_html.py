"""The html page of a flattened trace: its size, the time to write it beside the JSON document's,
and the time headless Chromium takes to load it (every table row in the DOM, every chart drawn)
beside an empty page's, so that the browser's own start-up is the baseline."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADS = 3  # each page is loaded this many times; the fastest counts


def load_seconds(page: Path) -> float:
    """Wall time of headless Chromium dumping the page's DOM after its scripts ran (fastest of LOADS)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        return float("nan")
    best = float("inf")
    for _ in range(LOADS):
        with tempfile.TemporaryDirectory() as profile:
            t0 = time.perf_counter()
            subprocess.run(
                [
                    exe,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    f"--user-data-dir={profile}",
                    "--dump-dom",
                    page.resolve().as_uri(),
                ],
                capture_output=True,
                timeout=300,
            )
            best = min(best, time.perf_counter() - t0)
    return best


def bench_html(flat_dir: Path, work: Path, measure) -> str:
    """One line: page MB, write time vs `-f json`, load time vs an empty page."""
    page, doc = work / "page.html", work / "page.json"
    base = [sys.executable, "-m", "pipeline", "analyze", str(flat_dir), "-o"]
    t_html, mb_html, _ = measure([*base, str(page), "-f", "html"])
    t_json, _, _ = measure([*base, str(doc), "-f", "json"])
    empty = work / "empty.html"
    empty.write_text("<!DOCTYPE html><title>empty</title>")
    t_empty, t_page = load_seconds(empty), load_seconds(page)
    return (
        f"html page of {flat_dir.name}: {page.stat().st_size / 1e6:.1f} MB (the JSON document "
        f"{doc.stat().st_size / 1e6:.1f} MB); written in {t_html:.1f} s = {t_html / t_json:.2f}x -f json "
        f"(peak {mb_html:.0f} MB); loaded by headless Chromium in {t_page:.2f} s against {t_empty:.2f} s for an "
        f"empty page ({t_page - t_empty:.2f} s for the page itself)"
    )
