"""Where command output goes: stdout or a file written atomically, csv folders; widths."""

from __future__ import annotations

import sys
from collections.abc import Sequence
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
    """Write a binary report (xlsx) to `out` atomically: `write(tmp_path)` makes it; without `out`,
    to stdout (a pipe or a file: `check_output` keeps it off a terminal), through a temporary file."""
    from pipeline.files import atomic_file, output_of

    if out is None:
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(prefix="tracepipe-out-") as tmp:
            made = Path(tmp) / "report"
            write(made)
            with open(made, "rb") as f:
                shutil.copyfileobj(f, sys.stdout.buffer)
            sys.stdout.flush()
        return
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


# what an -o file's extension says the format is (other extensions say nothing)
EXTENSIONS = {
    ".html": "html",
    ".htm": "html",
    ".xlsx": "xlsx",
    ".json": "json",
    ".csv": "csv",
    ".md": "md",
    ".markdown": "md",
    ".parquet": "parquet",
}
FORMAT_DEFAULT = " (default: from -o's extension: .html .xlsx .json .csv .md; else table)"  # --format's help
NOT_FOR_TERMINALS = ("html", "xlsx", "parquet")  # formats a terminal cannot show


def output_format(fmt: Optional[str], out: Optional[Path], formats: Sequence[str]) -> str:
    """The format of a command's output: --format, else what -o's extension says (`EXTENSIONS`,
    of the `formats` the command writes), else table. A --format the extension contradicts is a
    usage error (`-f csv -o report.html`); HTML, xlsx and Parquet never go to a terminal."""
    from pipeline.errors import UsageError

    implied = EXTENSIONS.get(out.suffix.lower()) if out is not None else None
    implied = implied if implied in formats else None
    if fmt is None:
        fmt = implied or "table"
    elif implied is not None and implied != fmt:
        assert out is not None
        raise UsageError(
            f"--format {fmt} but -o {out.name} is {implied}: drop --format (the extension decides) "
            f"or name the file for {fmt}"
        )
    keep_off_terminal(fmt, out)
    return fmt


def keep_off_terminal(fmt: str, out: Optional[Path]) -> None:
    """A usage error for HTML, xlsx or Parquet bound for a terminal (a pipe or a file is fine)."""
    from pipeline.errors import UsageError

    if fmt in NOT_FOR_TERMINALS and out is None and sys.stdout.isatty():
        raise UsageError(f"--format {fmt} does not go to a terminal: give -o FILE.{fmt} (or pipe it)")


def check_output(fmt: str, out: Optional[Path], section: Optional[list[str]] = None) -> bool:
    """Usage errors of -o for a format, before any work (see `output_format`); True for csv into a
    folder (-o DIR)."""
    from pipeline.errors import UsageError

    keep_off_terminal(fmt, out)
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
