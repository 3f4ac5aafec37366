"""progress: what a long command shows on stderr while it works, when stderr is a terminal.

    with FileProgress("big.json.gz", file_size, quiet) as p:    # one input (flatten, augment)
        p.stage("read"); p.advance_to(n); ...; p.stage("link+cost"); p.stage("write")
    with BatchProgress(quiet) as p:                               # many inputs (batch)
        p.start(total); p.finished("ok"); p.finished("quarantined"); p.echo("a warning")

One line, drawn by `rich.progress`: the label and stage, then for a stage that counts bytes
(`advance_to`) the % of the total, bytes, rate and ETA, for any other stage its elapsed time; for a
batch, done/total traces, traces/s, quarantined so far and ETA. The line is removed when the block
ends; `echo` writes a line above it, and stdout is left alone. When stderr is not a terminal, or
with quiet, there is no display: nothing is imported or drawn and each call returns at once. A
display that fails turns itself off: progress never stops a job.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, Task, TaskID

REFRESH_PER_SECOND = 8
LABEL_CHARS = 40  # a longer label keeps its start and its end
BAR_WIDTH = 24


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):  # replaced by something odd, or closed
        return False


# ------------------------------------------------------------------ the figures (pure text)
def clock(seconds: float) -> str:
    """0:07, 12:34, 1:02:03."""
    s = max(0, int(seconds))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


UNITS = ("B", "kB", "MB", "GB", "TB")


def size(n: float, of: float | None = None) -> str:
    """52.7 MB, or 52.7/117.0 MB (in the unit of `of`)."""
    scale = max(n, of or 0)
    k = 0
    while scale >= 1000 and k < len(UNITS) - 1:
        scale, k = scale / 1000, k + 1
    div, digits = 1000**k, 0 if k == 0 else 1
    if not of:
        return f"{n / div:.{digits}f} {UNITS[k]}"
    whole = f"{of / div:.{digits}f}"
    return f"{n / div:>{len(whole)}.{digits}f}/{whole} {UNITS[k]}"  # a steady width as n grows


def byte_figures(done: float, total: float | None, speed: float | None) -> str:
    """'45%  52.7/117.0 MB  88.3 MB/s  ETA 0:01', or what of it is known."""
    parts = [f"{min(100, int(100 * done // total)):3d}%", size(done, total)] if total else [size(done)]
    if speed:
        parts.append(f"{size(speed):>8}/s")
        if total and done < total:
            parts.append(f"ETA {clock((total - done) / speed)}")
    return "  ".join(parts)


def count_figures(
    done: int, total: int | None, elapsed: float, quarantined: int, failed: int = 0, nbytes: int = 0
) -> str:
    """'12/40 traces  1.92 traces/s  3.1 MB/s  3 quarantined  ETA 0:14', or what of it is known
    (nbytes: the inputs' bytes done)."""
    rate = done / elapsed if done and elapsed > 0 else None
    parts = [f"{done}/{total} traces" if total is not None else f"{done} traces"]
    if rate:
        parts.append(f"{rate:.2f} traces/s" if rate < 10 else f"{rate:.0f} traces/s")
        if nbytes:
            parts.append(f"{size(nbytes / elapsed)}/s")
    parts.append(f"{quarantined} quarantined")
    if failed:
        parts.append(f"{failed} failed")
    if rate and total is not None and total > done:
        parts.append(f"ETA {clock((total - done) / rate)}")
    return "  ".join(parts)


def short(label: str, limit: int = LABEL_CHARS) -> str:
    return label if len(label) <= limit else f"{label[: limit // 2 - 1]}…{label[-(limit - limit // 2) :]}"


# ------------------------------------------------------------------ the displays
D = TypeVar("D", bound="_Display")
P = ParamSpec("P")


def _quietly(method: Callable[Concatenate[D, P], None]) -> Callable[Concatenate[D, P], None]:
    """A display method: nothing when there is no display; an error turns the display off."""

    @functools.wraps(method)
    def run(self: D, *args: P.args, **kwargs: P.kwargs) -> None:
        if self._progress is None:
            return
        try:
            method(self, *args, **kwargs)
        except Exception:
            self._off()

    return run


class _Display:
    """A rich Progress on stderr (`on`), or none. Use it as a context manager."""

    def __init__(self, quiet: bool, console: Console | None, figures: Callable[[Task], str], stage: bool):
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if quiet or not (console.is_terminal if console is not None else stderr_is_terminal()):
            return
        try:
            self._progress = _make_progress(console, figures, stage)
        except Exception:
            self._progress = None

    @property
    def on(self) -> bool:
        return self._progress is not None

    def __enter__(self: D) -> D:
        self._start()
        return self

    def __exit__(self, *exc) -> None:
        self._off()

    @_quietly
    def _start(self) -> None:
        assert self._progress is not None
        self._progress.start()
        self._begin()

    def _begin(self) -> None:
        """Add the first task."""

    def _off(self) -> None:
        progress, self._progress = self._progress, None
        if progress is not None:
            with contextlib.suppress(Exception):
                progress.stop()  # the line is removed (transient), stderr given back

    def echo(self, line: str) -> None:
        """Write a line to stderr: above the display while it shows, else plainly."""
        if self._progress is not None:
            try:
                self._progress.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)
                return
            except Exception:
                self._off()
        print(line, file=sys.stderr, flush=True)


class FileProgress(_Display):
    """One input worked through in stages: `stage(name)` as each begins, `advance_to(bytes)` in a
    stage that reads the file (% of `total_bytes`, rate, ETA); other stages show their elapsed time.
    A stage that counted bytes shows them all done when the next one begins."""

    def __init__(self, label: str, total_bytes: int | None, quiet: bool = False, console: Console | None = None):
        super().__init__(quiet, console, _file_figures, stage=True)
        self.label, self.total = short(label), total_bytes or None

    def _begin(self) -> None:
        self.stage("")

    @_quietly
    def stage(self, name: str) -> None:
        p = self._progress
        assert p is not None
        if self._task is not None:
            task = next(t for t in p.tasks if t.id == self._task)
            if task.fields.get("measured") and task.total:
                p.update(self._task, completed=task.total)
            p.refresh()  # the stage's last frame, then the next stage's
            p.remove_task(self._task)
        self._task = p.add_task(self.label, total=None, stage=name, measured=False)
        p.refresh()

    @_quietly
    def advance_to(self, done: int) -> None:
        assert self._progress is not None and self._task is not None
        self._progress.update(self._task, completed=done, total=self.total, measured=True)


class BatchProgress(_Display):
    """Many inputs: `start(total)` once their number is known (None: unknown), `finished(kind)` as
    each finishes (kind `quarantined` and `failed` are counted apart)."""

    def __init__(self, quiet: bool = False, console: Console | None = None, label: str = "batch"):
        super().__init__(quiet, console, _batch_figures, stage=False)
        self.label, self.done, self.quarantined, self.failed, self.nbytes = label, 0, 0, 0, 0
        self.total: int | None = None

    def _begin(self) -> None:
        assert self._progress is not None
        self._task = self._progress.add_task(self.label, total=None, **self._counts())

    def _counts(self) -> dict:
        return {
            "n": self.done,
            "of": self.total,
            "quarantined": self.quarantined,
            "failed": self.failed,
            "nbytes": self.nbytes,
        }

    @_quietly
    def start(self, total: int | None) -> None:
        assert self._progress is not None and self._task is not None
        self.total = total
        self._progress.update(self._task, total=total, refresh=True, **self._counts())

    @_quietly
    def finished(self, kind: str, nbytes: int = 0) -> None:
        assert self._progress is not None and self._task is not None
        self.done += 1
        self.nbytes += nbytes
        self.quarantined += kind == "quarantined"
        self.failed += kind == "failed"
        if self.total is not None and self.done > self.total:  # more than counted up front
            self.total = self.done
        self._progress.update(self._task, completed=self.done, total=self.total, **self._counts())


def _file_figures(task: Task) -> str:
    if task.fields.get("measured"):
        speed = task.speed or (task.completed / task.elapsed if task.elapsed else None)
        return byte_figures(task.completed, task.total, speed)
    return clock(task.elapsed or 0)


def _batch_figures(task: Task) -> str:
    f = task.fields
    return count_figures(f["n"], f["of"], task.elapsed or 0, f["quarantined"], f["failed"], f["nbytes"])


def _make_progress(console: Console | None, figures: Callable[[Task], str], stage: bool) -> Progress:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
    from rich.table import Column
    from rich.text import Text

    class Figures(ProgressColumn):
        def render(self, task: Task) -> Text:
            try:
                return Text(figures(task), no_wrap=True, overflow="ellipsis")
            except Exception:  # a figure that cannot be had is left out
                return Text("")

    def whole() -> Column:  # a column kept whole: on a narrow terminal the bar gives way first
        return Column(no_wrap=True)

    columns: list[ProgressColumn] = [
        SpinnerColumn(),
        TextColumn("{task.description}", style="bold", markup=False, table_column=whole()),
    ]
    if stage:
        columns.append(TextColumn("{task.fields[stage]}", style="cyan", markup=False, table_column=whole()))
    columns += [BarColumn(bar_width=None, table_column=Column(min_width=4, max_width=BAR_WIDTH)), Figures(whole())]
    return Progress(
        *columns,
        console=console or Console(stderr=True),
        transient=True,
        redirect_stdout=False,  # stdout is the command's output: never through the display
        redirect_stderr=True,  # what is printed to sys.stderr shows above the line
        refresh_per_second=REFRESH_PER_SECOND,
    )
