"""match: the same collective on every rank of a run.

The i-th collective of a process group on each rank is one collective: rows match on (run, pg,
seq). A process group is known across ranks by its global ranks (names may differ between ranks),
and, among the groups of one rank with the same ranks, by the order of their names: `pg` is
`0,1,2,3#0`. Collectives with no group recorded belong to the whole world (`all#0`).

Matched calls must agree: the same kind (unknown agrees with any) and the same message size (an
unknown size agrees with any; the ranks of an alltoall may send buffers of different sizes,
`messages.SIZE_PER_RANK`). A rank whose call differs from what most ranks did is
desynchronised there: reported (rank, pg, seq, what it did, what the others did) and the
collective left out of every measure rather than paired wrongly.
"""

from __future__ import annotations

import polars as pl

from pipeline.cost.formulas.messages import SIZE_PER_RANK


def pg_key() -> pl.Expr:
    """The cross-rank name of a collective's process group (see the module docstring), over rows of
    (run, rank, pg_name, pg_ranks)."""
    ranks = (
        pl.col("pg_ranks")
        .cast(pl.String)
        .str.extract_all(r"-?\d+")
        .list.eval(pl.element().cast(pl.Int64))
        .list.sort()
        .list.eval(pl.element().cast(pl.String))
        .list.join(",")
    )
    members = pl.when(ranks.is_null() | (ranks == "")).then(pl.lit("all")).otherwise(ranks)
    order = pl.col("pg_name").cast(pl.String).cast(pl.Int64, strict=False)
    index = (
        pl.struct(order.fill_null(-1).alias("o"), pl.col("pg_name").cast(pl.String).fill_null("").alias("n"))
        .rank("dense")
        .over("run", "rank", members)
        - 1
    )
    return pl.concat_str(members, pl.lit("#"), index.cast(pl.String))


def with_pg(calls: pl.LazyFrame) -> pl.LazyFrame:
    """Calls with `pg`, worked out once per distinct group of a rank (a group's ranks are long text:
    2.6 M calls of a 256-rank run would hold gigabytes of it) and joined in as a category."""
    groups = ["run", "rank", "pg_name", "pg_ranks"]
    keys = calls.select(groups).unique().collect().with_columns(pg=pg_key().cast(pl.Categorical))
    return calls.join(keys.lazy(), on=groups, how="left", nulls_equal=True).drop("pg_name", "pg_ranks")


def _mode(col: str) -> pl.Expr:
    """The value most ranks give (ties: the smallest), ignoring unknowns."""
    known = pl.col(col).filter(pl.col(col).is_not_null() & (pl.col(col).cast(pl.String) != "unknown"))
    return known.mode().sort().first()


KEYS = ["run", "pg", "seq"]
SAME_SIZE = ~pl.col("kind").cast(pl.String).is_in(sorted(SIZE_PER_RANK))  # calls whose sizes must agree


def desyncs(colls: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, pg, seq, kind, bytes, expected_kind, expected_bytes) of every call that differs
    from the rest of its collective (only the collectives whose calls disagree are looked at)."""
    known_kind = pl.col("kind").filter(pl.col("kind").is_not_null() & (pl.col("kind").cast(pl.String) != "unknown"))
    split = (
        colls.lazy()
        .group_by(KEYS)
        .agg(kinds=known_kind.n_unique(), sizes=pl.col("bytes").filter(SAME_SIZE).drop_nulls().n_unique())
        .filter((pl.col("kinds") > 1) | (pl.col("sizes") > 1))
        .select(KEYS)
        .collect(engine="streaming")
    )  # the streaming engine groups 2.6 M calls in a tenth of the memory
    suspects = colls.join(split, on=KEYS, how="semi")
    expected = suspects.group_by(KEYS).agg(expected_kind=_mode("kind"), expected_bytes=_mode("bytes"))
    rows = suspects.join(expected, on=KEYS, how="left")
    wrong_kind = (
        (pl.col("kind") != "unknown")
        & pl.col("expected_kind").is_not_null()
        & (pl.col("kind") != pl.col("expected_kind"))
    )
    wrong_bytes = (
        SAME_SIZE
        & pl.col("bytes").is_not_null()
        & pl.col("expected_bytes").is_not_null()
        & (pl.col("bytes") != pl.col("expected_bytes"))
    )
    return (
        rows.filter(wrong_kind | wrong_bytes)
        .select("run", "rank", "pg", "seq", "kind", "bytes", "expected_kind", "expected_bytes")
        .sort("run", "pg", "seq", "rank")
    )


def consistent(colls: pl.DataFrame, bad: pl.DataFrame) -> pl.DataFrame:
    """The calls of collectives no rank desynchronised."""
    return colls.join(bad.select(KEYS).unique(), on=KEYS, how="anti") if bad.height else colls
