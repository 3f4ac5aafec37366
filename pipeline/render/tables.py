"""tables: one frame written as an aligned text table, Markdown, CSV or JSON rows: the one writer
of `analyze`, `diff`, `query` and `ranks`.

Numbers have one style per unit, chosen by the column's name (`cell`): times (`*_us`) and rates
(`*_gbps`, `*_tflops`) with thousands separators and 2 decimals, percentages (`*_pct`) with 1,
FLOPs and bytes in engineering units (`5.51 T`, `2.09 GB`), counts as integers with separators,
identifiers (`IDS`: device, stream, tid, ...) without.
A text table fits a width (`--width`, else the terminal's): the widest names are shortened in
the middle, ending in a stable id (`#3f2a`, from the whole name: two names that differ only in
their middle stay apart), then the least important columns (the last) are left out and named
below the table. Markdown and CSV are not fitted (they are for sharing).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import sys
from collections.abc import Iterable
from decimal import Decimal
from typing import TYPE_CHECKING

from pipeline.render.rows import Rows

if TYPE_CHECKING:  # imported where used: a first look at a run folder prints tables without polars
    import polars as pl

from pipeline.analyses.names import readable, unwrapped

MIN_NAME = 18  # a shortened name keeps at least this many characters
GAP = 2  # spaces between columns
SEQUENCE = "kernels"  # a column of kernel sequences (lists of names): one name per line
THEN = "→ "  # before each kernel of a sequence but the first
LINES = (SEQUENCE, "top")  # columns of lists of names shown one name per line
ENG = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
# columns of identifiers, written without thousands separators (a thread is 3553, not 3,553)
IDS = {"device", "stream", "rank", "pid", "tid", "seq", "correlation", "last_rank", "step"}


def is_id(column: str) -> bool:
    """Whether a column holds identifiers (IDS, `*_id`, `*_idx`) rather than counts."""
    c = column.lower()
    return c in IDS or c.endswith(("_id", "_idx"))


def finite(df: pl.DataFrame) -> pl.DataFrame:
    """Float NaN / inf as null (JSON has no NaN)."""
    import polars as pl

    floats = [c for c, t in df.schema.items() if t.is_float()]
    return df.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats)


def records(df: pl.DataFrame, drop: tuple[str, ...] = ()) -> list[dict]:
    """The rows as JSON-ready dicts (NaN / inf as None), without the `drop` columns it has."""
    return finite(df.drop([c for c in drop if c in df.columns])).to_dicts()


def dumps(doc: dict) -> str:
    """A JSON document as indented text, with a final newline."""
    import orjson

    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"


# ------------------------------------------------------------------ cells
def engineering(v: float, unit: str = "") -> str:
    """5.51e12 -> '5.51 T' (with `unit` after the prefix: '2.09 GB')."""
    a = abs(v)
    for scale, prefix in ENG:
        if a >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}".rstrip() if a else f"0 {unit}".rstrip()


def number(v: float | int, column: str) -> str:
    """One number in its column's style (see the module docstring)."""
    c = column.lower()
    if isinstance(v, float) and not math.isfinite(v):
        return ""
    if c == "flops" or c.endswith("_flops") or c.startswith("flops"):
        return engineering(float(v))
    if c == "bytes" or c.endswith("_bytes"):
        return engineering(float(v), "B")
    if c.endswith("_pct"):
        return f"{v:,.1f}"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v) if is_id(c) else f"{v:,}"
    if c in ("us", "ms", "s", "ns") or c.endswith(("_us", "_ms", "_s", "_gbps", "_tflops", "_ns")):
        return f"{v:,.2f}"
    a = abs(v)
    return f"{v:.3g}" if a >= 1e6 or (a and a < 0.01) else f"{v:,.2f}"


def spans(ranks: Iterable[int], most: int | None = 8) -> str:
    """Sorted ranks as runs of consecutive ones (`1-127, 130`), the first `most` runs (None: all)
    and a count after them: a list of 127 missing ranks one by one filled a page or a cell."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    cut = runs if most is None else runs[:most]
    text = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in cut)
    return text + (f", … ({sum(b - a + 1 for a, b in runs):,} ranks)" if len(cut) < len(runs) else "")


def cell(v, column: str = "", name_limit: int | None = None) -> str:
    """One value as table / md text (names cut in the middle to name_limit characters)."""
    if v is None:
        return ""
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, (int, float)):
        return number(v, column)
    if isinstance(v, (list, tuple)) and column in LINES:  # one name per line, whole (shortened later)
        then = THEN if column == SEQUENCE else ""
        return "\n".join((then if i else "") + readable(str(k)) for i, k in enumerate(v))
    if isinstance(v, (list, tuple)):
        return ",".join(cell(x, column, None) for x in v)
    if isinstance(v, dict):
        return str(v.get("name", v))
    s = readable(str(v))
    return shorten(s, name_limit) if name_limit else s


def shorten(s: str, limit: int, names: bool = True) -> str:
    """s in at most `limit` characters. A C++ name is first made compact (`compact`); what still
    does not fit keeps its start and end around an ellipsis. A shortened name ends in ` #` and four
    hex digits of the whole name's hash: the same name always gets the same id, and two names that
    differ only where they were cut stay apart (under MIN_NAME characters there is no room for it).
    `names`: False for text that is not one name (a kernel sequence): cut, never made compact.
    A mangled C++ name is shown demangled (`names.readable`)."""
    s = readable(s) if names else s
    if len(s) <= limit:
        return s
    if limit < MIN_NAME:
        head = max(limit - 1, 1) * 2 // 3
        return s[:head] + "…" + s[len(s) - max(limit - 1 - head, 0) :] if limit > 1 else "…"
    tag = " #" + hashlib.blake2b(s.encode(), digest_size=2).hexdigest()
    room = limit - len(tag)
    short = compact(s, room) if names else s
    if len(short) <= room:
        return short + tag
    head = (room - 1 + 1) // 2 + (room - 1) // 4
    return short[:head] + "…" + short[len(short) - (room - 1 - head) :] + tag


_SCOPE = re.compile(r"\b(?!anonymous\b)[A-Za-z_]\w*::")  # a namespace or class qualifier
_CPP = re.compile(r"::|<|\w\(")  # what a C++ symbol has and other names (`Memcpy DtoD (Device -> Device)`) lack
_SPACES = re.compile(r"\s*([<>,*&])\s*")


def compact(name: str, room: int) -> str:
    """A C++ kernel name made shorter step by step, until it fits `room`: a launch wrapper's name
    as the kernel it launches (`names.LAUNCH_WRAPPERS`), without the return type `void` and the
    parameter list, then without namespace qualifiers, then without spaces around template
    punctuation, then without `(…)`, then with its template arguments as the one that tells its
    instances apart (`<…MulFunctor…>`, see `template_hint`), then as `<…>`. Other names come back
    as they are."""
    steps = (
        unwrapped,
        lambda n: _without_params(n.removeprefix("void ")),
        lambda n: _SCOPE.sub("", n.replace("(anonymous namespace)::", "")),
        lambda n: _SPACES.sub(r"\1", n),
        lambda n: n.removesuffix("(…)"),
        lambda n: _without_template_args(n, hints=True),
        _without_template_args,
    )
    if not _CPP.search(name):
        return name
    for step in steps:
        if len(name) <= room:
            break
        name = step(name)
    return name


def _without_params(name: str) -> str:
    """f<T>(int, g(x)) -> f<T>(…): a trailing parameter list (balanced, any depth) elided."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] + "(…)" if i and (name[i - 1].isalnum() or name[i - 1] in "_>") else name
    return name


def _without_template_args(name: str, hints: bool = False) -> str:
    """a<b<c>, d>::e<f> -> a<…>::e<…> (the outermost template argument lists elided); `hints`:
    each as what tells its instances apart, where it says (`template_hint`: `a<…MulFunctor…>`)."""
    out: list[str] = []
    args: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            depth += 1
            if depth == 1:
                args = []
                continue
        elif ch == ">" and depth:
            depth -= 1
            if depth == 0:
                hint = template_hint("".join(args)) if hints else None
                out.append(f"<…{hint}…>" if hint else "<…>")
                continue
        if depth:
            args.append(ch)
        else:
            out.append(ch)
    return "".join(out)


_FUNCTOR = re.compile(r"[A-Za-z_]\w*Functor\w*")  # MulFunctor, CUDAFunctor_add, BinaryFunctor
_OPS = re.compile(r"[A-Za-z_]\w*Ops\b")  # a reduction's MeanOps, WelfordOps
_CALLED = re.compile(r"([A-Za-z_]\w*)(?:<[^<>()]*>)?\(")  # a lambda's function: direct_copy_kernel_cuda(
_NOT_CALLED = {"lambda", "operator", "void"}
_CALLED_SUFFIXES = ("_kernel_cuda", "_kernel_impl", "_kernel", "_cuda", "_impl")


def template_hint(args: str) -> str | None:
    """What tells apart the instances of a kernel template, from the text of its arguments: the
    innermost functor (`BinaryFunctor<float, …, MulFunctor<float>>` -> MulFunctor), else the function
    whose lambda it runs (`direct_copy_kernel_cuda(…)::{lambda…}` -> direct_copy; also inside a
    functor), else a reduction's ops class (MeanOps); None when the arguments are only types and
    numbers."""
    for m in _FUNCTOR.finditer(args):
        inner = _inner(args, m.end())
        if not _FUNCTOR.search(inner):
            return _called(inner) or m.group(0)
    if called := _called(args):
        return called
    for m in _OPS.finditer(args):
        if not _OPS.search(_inner(args, m.end())):
            return m.group(0)
    return None


def _called(text: str) -> str | None:
    """The first function named in `text` (not a lambda or an operator), without `_kernel_cuda`."""
    for m in _CALLED.finditer(text):
        name = m.group(1)
        if name not in _NOT_CALLED:
            for suffix in _CALLED_SUFFIXES:
                if name.endswith(suffix) and len(name) > len(suffix):
                    return name[: -len(suffix)]
            return name
    return None


def _inner(text: str, at: int) -> str:
    """The template argument list opening at text[at], without its brackets ('' if none opens there)."""
    if not text.startswith("<", at):
        return ""
    depth = 0
    for i in range(at, len(text)):
        depth += {"<": 1, ">": -1}.get(text[i], 0)
        if depth == 0:
            return text[at + 1 : i]
    return text[at + 1 :]


# ------------------------------------------------------------------ writers
def check_columns(columns: list[str] | None, tables: Iterable[pl.DataFrame | Rows]) -> None:
    """A usage error for a --columns name no table shown has (with the closest one that does)."""
    from pipeline.errors import UsageError, did_you_mean

    known = dict.fromkeys(c for df in tables for c in df.columns)
    unknown = [c for c in columns or () if c not in known]
    if unknown:
        said = did_you_mean(unknown[0], known)
        raise UsageError(f"--columns {unknown[0]!r}: no table shown has that column{said}")


def terminal_width() -> int | None:
    """The width a text table should fit: $COLUMNS, else the terminal's; None (no limit) when
    stdout is neither."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def render(
    df: pl.DataFrame | Rows,
    fmt: str,
    name_limit: int | None = None,
    width: int | None = None,
    columns: list[str] | None = None,
) -> str:
    """A frame as an aligned text table fitted to `width`, Markdown or CSV (`columns`: only these,
    in this order, of those it has); names longer than `name_limit` are shortened (`shorten`)."""
    if columns:
        df = df.select([c for c in columns if c in df.columns] or df.columns)
    if fmt == "csv":
        return _rows_csv(df) if isinstance(df, Rows) else _csv(df)
    head = list(df.columns)
    body = [[cell(v, c) for v, c in zip(row, head)] for row in df.iter_rows()]
    numeric = [df.is_numeric(c) if isinstance(df, Rows) else df.schema[c].is_numeric() for c in head]
    limits = [0 if numeric[i] or not name_limit else name_limit for i in range(len(head))]
    if fmt == "md":
        return _markdown(head, [[c.replace("\n", " ") for c in r] for r in _shortened(body, head, limits)])
    return _text(head, body, numeric, width, limits)


def _shortened(body: list[list[str]], head: list[str], limits: list[int]) -> list[list[str]]:
    """Each text cell (each line of it) cut to its column's limit (0: none), once, from its whole value."""
    cut = lambda c, i: "\n".join(_shorten_line(x, limits[i]) for x in c.split("\n")) if limits[i] else c
    return [[cut(c, i) for i, c in enumerate(r)] for r in body]


def _shorten_line(line: str, limit: int) -> str:
    """A line of a cell shortened; a sequence's `→ name` keeps its arrow, and its id is the name's."""
    if line.startswith(THEN):
        return THEN + shorten(line[len(THEN) :], max(limit - len(THEN), 1))
    return shorten(line, limit)


def _text(head: list[str], body: list[list[str]], numeric: list[bool], width: int | None, limits: list[int]) -> str:
    """An aligned table. Fitting a width: text columns narrowed to a third of it (names cut with
    an id), then the last columns left out, then texts narrowed to MIN_NAME."""
    widths = [max([len(h)] + [len(x) for r in body for x in r[i].split("\n")]) for i, h in enumerate(head)]
    texts = [i for i in range(len(head)) if not numeric[i]]
    for i in texts:
        widths[i] = min(widths[i], max(limits[i] or widths[i], len(head[i])))
    keep = list(range(len(head)))
    if width:
        comfort = max(MIN_NAME, width // 3)
        _narrow(widths, texts, head, keep, width, comfort)
        while _total(widths, keep) > width and len(keep) > 2:
            keep.pop()
        _narrow(widths, texts, head, keep, width, MIN_NAME)
    body = _shortened(body, head, [widths[i] if i in texts else 0 for i in range(len(head))])

    def line(r: list[str]) -> str:
        return (" " * GAP).join(r[i].rjust(widths[i]) if numeric[i] else r[i].ljust(widths[i]) for i in keep).rstrip()

    def lines(r: list[str]) -> list[str]:  # a row whose cells hold several lines: one line each
        split = [c.split("\n") for c in r]
        depth = max(len(c) for c in split)
        return [line([c[k] if k < len(c) else "" for c in split]) for k in range(depth)]

    out = [line(head), line(["-" * w for w in widths]), *(x for r in body for x in lines(r))]
    hidden = [head[i] for i in range(len(head)) if i not in keep]
    return "\n".join(out + ([_hidden_note(hidden, width)] if hidden else [])) + "\n"


def _total(widths: list[int], keep: list[int]) -> int:
    return sum(widths[i] for i in keep) + GAP * (len(keep) - 1)


def _narrow(widths: list[int], texts: list[int], head: list[str], keep: list[int], width: int, floor: int):
    """Narrow the widest shown text columns, down to `floor` (or their header), until the table fits."""
    while _total(widths, keep) > width:
        wide = [i for i in texts if i in keep and widths[i] > max(floor, len(head[i]))]
        if not wide:
            return
        i = max(wide, key=lambda j: widths[j])
        widths[i] = max(floor, len(head[i]), widths[i] - (_total(widths, keep) - width))


def _hidden_note(hidden: list[str], width: int | None) -> str:
    """The line under a table naming the columns left out, itself within the width."""
    note = f"({len(hidden)} more: {', '.join(hidden)}; see --width, --columns)"
    return note if not width or len(note) <= width else note[: max(width - 2, 1)] + "…)"


def _csv(df: pl.DataFrame) -> str:
    """Every column, lists joined by ';' (structs left out), NaN / inf as empty cells."""
    import polars as pl

    lists = [c for c, t in df.schema.items() if isinstance(t, pl.List) and isinstance(t.inner, pl.String | pl.Int64)]
    df = df.with_columns(pl.col(c).cast(pl.List(pl.String)).list.join(";") for c in lists)
    nested = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Struct))]
    return finite(df.drop(nested)).write_csv()


def _rows_csv(rows: Rows) -> str:
    """`_csv` of Rows: lists joined by ';', NaN / inf and null as empty cells, floats as polars
    writes them."""
    import csv
    import io

    def text(v) -> str:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return ""
        if isinstance(v, bool):
            return str(v).lower()
        if isinstance(v, (list, tuple)):
            return ";".join(str(x) for x in v)
        return repr(v) if isinstance(v, float) else str(v)

    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(rows.columns)
    for row in rows.iter_rows():
        w.writerow([text(v) for v in row])
    return out.getvalue()


def _markdown(head: list[str], body: list[list[str]]) -> str:
    esc = lambda s: s.replace("|", "\\|")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in body]
    return "\n".join(lines) + "\n"
