"""rows: a small table of named columns (Python lists) that the table writer (`tables.render`)
prints as it prints a polars frame: what `tracepipe ranks` builds its sections of, so that a first
look at a run folder never imports polars. `to_polars()` gives the frame where one is wanted."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any


class Rows:
    """Columns of equal length, in order; `numeric` says which hold numbers (right-aligned)."""

    def __init__(self, columns: Mapping[str, Any], numeric: Iterable[str] | None = None):
        self.data = {c: v if hasattr(v, "tolist") else list(v) for c, v in columns.items()}  # numpy arrays kept
        lengths = {len(v) for v in self.data.values()}
        assert len(lengths) <= 1, f"columns of unequal length: {lengths}"
        self.height = lengths.pop() if lengths else 0
        self._numeric = set(numeric) if numeric is not None else {c for c, v in self.data.items() if _numbers(v)}

    @property
    def columns(self) -> list[str]:
        return list(self.data)

    def is_numeric(self, column: str) -> bool:
        return column in self._numeric

    def iter_rows(self, named: bool = False) -> Iterator:
        """The rows as tuples (dicts with `named`) of plain Python values, a block at a time."""
        names = list(self.data)
        for a in range(0, self.height, BLOCK):
            cols = [_plain(v[a : a + BLOCK]) for v in self.data.values()]
            for row in zip(*cols):
                yield dict(zip(names, row)) if named else row

    def select(self, columns: Sequence[str]) -> Rows:
        return Rows({c: self.data[c] for c in columns}, [c for c in columns if c in self._numeric])

    def head(self, n: int) -> Rows:
        return Rows({c: v[:n] for c, v in self.data.items()}, self._numeric)

    def take(self, order: Sequence[int]) -> Rows:
        return Rows({c: [_plain(v[i : i + 1])[0] for i in order] for c, v in self.data.items()}, self._numeric)

    def filter(self, keep: Sequence[bool]) -> Rows:
        return self.take([i for i, k in enumerate(keep) if k])

    def sort_desc(self, column: str) -> Rows:
        """Largest first (nulls and NaN last), stable."""
        v: Any = self.data[column]
        if hasattr(v, "dtype") and v.dtype.kind in "iuf":
            import numpy as np

            by = np.argsort(-np.nan_to_num(v.astype(float), nan=-np.inf), kind="stable")
            cols = {c: x[by] if hasattr(x, "dtype") else [x[i] for i in by] for c, x in self.data.items()}
            return Rows(cols, self._numeric)
        values = _plain(v)
        order = sorted(range(self.height), key=lambda i: (values[i] is None, -(values[i] or 0)))
        return self.take(order)

    def to_polars(self, schema: dict | None = None):
        import polars as pl

        data = {c: _plain(v) for c, v in self.data.items()}
        return pl.DataFrame(data, schema=schema, strict=False) if data else pl.DataFrame()


BLOCK = 1 << 16  # rows turned into Python values at a time


def _plain(values) -> list:
    """Python values of a column's slice (a numpy array's as its tolist gives them)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _numbers(values) -> bool:
    if hasattr(values, "dtype"):
        return values.dtype.kind in "iuf"
    seen = False
    for v in values:
        if v is None:
            continue
        if type(v) not in (int, float):
            return False
        seen = True
    return seen
