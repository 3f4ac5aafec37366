"""rows: a small table of named columns (Python lists) that the table writer (`tables.render`)
prints as it prints a polars frame: what `tracepipe ranks` builds its sections of, so that a first
look at a run folder never imports polars. `to_polars()` gives the frame where one is wanted."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence


class Rows:
    """Columns of equal length, in order; `numeric` says which hold numbers (right-aligned)."""

    def __init__(self, columns: Mapping[str, Sequence], numeric: Iterable[str] | None = None):
        self.data = {c: list(v) for c, v in columns.items()}
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
        cols = list(self.data.values())
        names = list(self.data)
        for i in range(self.height):
            row = tuple(c[i] for c in cols)
            yield dict(zip(names, row)) if named else row

    def select(self, columns: Sequence[str]) -> Rows:
        return Rows({c: self.data[c] for c in columns}, [c for c in columns if c in self._numeric])

    def head(self, n: int) -> Rows:
        return Rows({c: v[:n] for c, v in self.data.items()}, self._numeric)

    def take(self, order: Sequence[int]) -> Rows:
        return Rows({c: [v[i] for i in order] for c, v in self.data.items()}, self._numeric)

    def filter(self, keep: Sequence[bool]) -> Rows:
        return self.take([i for i, k in enumerate(keep) if k])

    def sort_desc(self, column: str) -> Rows:
        """Largest first (nulls last), stable."""
        v = self.data[column]
        order = sorted(range(self.height), key=lambda i: (v[i] is None, -(v[i] or 0)))
        return self.take(order)

    def to_polars(self, schema: dict | None = None):
        import polars as pl

        return pl.DataFrame(self.data, schema=schema, strict=False) if self.data else pl.DataFrame()


def _numbers(values: list) -> bool:
    seen = False
    for v in values:
        if v is None:
            continue
        if type(v) not in (int, float):
            return False
        seen = True
    return seen
