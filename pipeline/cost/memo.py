"""memo: regex classifications of GPU ops (category, kernel role, math mode) made once per distinct key.

A trace has hundreds of thousands of GPU ops but a few hundred distinct kernel names: each table of
regexes (`categories`, `kernel_roles`, `math_modes`) is applied to the distinct keys only (once
over all the batches sharing a `Memo`) and joined back, on the keys as categoricals (small ids
rather than long kernel names), beside the frame's columns rather than copying them.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

Text = Callable[[str], pl.Expr]  # a key column as text


class Memo:
    """The classes of the keys seen so far, when a table is classified batch by batch."""

    def __init__(self) -> None:
        self.named: pl.DataFrame | None = None


def classified(
    frame: pl.DataFrame, keys: list[str], classes: Callable[[Text], dict[str, pl.Expr]], memo: Memo | None = None
) -> pl.DataFrame:
    """`frame` with the columns `classes` makes (name -> expression over the key columns, read as
    text through its argument), each computed once per distinct key (a null key matching null)."""
    keys = list(dict.fromkeys(keys))
    as_keys = frame.select(
        pl.col(k).cast(pl.Categorical) if t == pl.String else pl.col(k) for k, t in frame.select(keys).schema.items()
    )
    new = as_keys.unique()
    if memo is not None and memo.named is not None:
        new = new.join(memo.named, on=keys, how="anti", nulls_equal=True)
    if new.is_empty() and memo is not None and memo.named is not None:
        named = memo.named  # nothing new: not even the expressions are built (their regexes are many)
    else:
        named = new.with_columns(**classes(lambda c: pl.col(c).cast(pl.String)))
        if memo is not None:
            named = memo.named = named if memo.named is None else pl.concat([memo.named, named])
    out = as_keys.join(named, on=keys, how="left", nulls_equal=True, maintain_order="left")
    return frame.with_columns(*out.drop(keys).get_columns())
