"""Where command output goes: stdout or a file written atomically, csv folders; widths."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from pipeline.cli.guard import say as err


def write_report(text, out: Optional[Path]):
    """Print or write (atomically) a report: text, or bytes chunks (a large JSON document, streamed)."""
    chunks = [text.encode()] if isinstance(text, str) else text
    if out is None:
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        return
    from pipeline.files import atomic_file, output_of

    with output_of(out), atomic_file(out) as tmp, open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)


def write_file(out: Optional[Path], write):
    """Write a binary report (xlsx) to `out` atomically: `write(tmp_path)` makes it."""
    from pipeline.files import atomic_file, output_of

    assert out is not None, "checked by check_output"
    with output_of(out), atomic_file(out) as tmp:
        write(tmp)


def write_csv_folder(folder: Optional[Path], sheets, columns: Optional[list[str]]):
    """csv -o DIR: one file per section, DIR/<section>.csv, each written atomically."""
    from pipeline.files import atomic_file, output_of
    from pipeline.render.tables import render

    assert folder is not None
    with output_of(folder):
        folder.mkdir(parents=True, exist_ok=True)
        for name, df in sheets.items():
            with atomic_file(folder / f"{name}.csv") as tmp:
                tmp.write_text(render(df, "csv", columns=columns))
    err(f"wrote {len(sheets)} sections to {folder}/ ({', '.join(f'{n}.csv' for n in sheets)})")


def check_output(fmt: str, out: Optional[Path], section: Optional[list[str]] = None) -> bool:
    """Usage errors of -o for a format, before any work; True for csv into a folder (-o DIR)."""
    from pipeline.errors import UsageError

    if fmt == "xlsx" and out is None:
        raise UsageError("--format xlsx writes a file: give -o REPORT.xlsx")
    csv_dir = fmt == "csv" and out is not None and out.suffix.lower() != ".csv"
    if fmt == "csv" and not csv_dir and section and len(section) > 1:
        raise UsageError("--format csv writes one section to a file: give one --section, or -o DIR for one file each")
    return csv_dir


def fitted_width(width: Optional[int]) -> Optional[int]:
    """--width: N columns, 0 no limit, default the terminal's (none when not printing to one)."""
    from pipeline.render.tables import terminal_width

    return terminal_width() if width is None else width or None


def column_list(columns: Optional[str]) -> Optional[list[str]]:
    return [c.strip() for c in columns.split(",") if c.strip()] if columns else None
