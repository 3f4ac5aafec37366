"""clock: how far each rank's clock reads ahead of the lowest rank's.

Ranks on different hosts have clocks that disagree by up to milliseconds. Ranks leave a blocking
collective (allreduce, allgather, reducescatter, alltoall, barrier) at almost the same instant, so
the end of one collective on rank r is its true end plus r's offset. Offsets are estimated from
such collectives that two or more ranks recorded (up to `SAMPLE` per process group, evenly
spread), robustly: the true end of a collective is
the median of its ranks' ends less their offsets, a rank's offset the median over its collectives
of its end less their true ends; five rounds of this settle (all offsets start at 0). Offsets are
then taken relative to the lowest rank (of each group of ranks that share collectives at all).

A rank that is never in a blocking collective with another cannot be aligned: its offset is null
(and taken as 0 for waits). Ranks that share a clock come out at about 0.
"""

from __future__ import annotations

import polars as pl

BLOCKING = ("allreduce", "allgather", "reducescatter", "alltoall", "barrier")
ROUNDS = 5
SAMPLE = 2_000  # collectives per process group used (evenly spread): a median needs no more
KEYS = ["run", "pg", "seq"]


def _ends(colls: pl.DataFrame) -> pl.DataFrame:
    """(run, pg, seq, rank, end) of blocking collectives that at least two ranks recorded; ends as
    float ns since the run's earliest end (an epoch-scale int64 would lose ns in a float)."""
    blocking = colls.lazy().filter(pl.col("kind").is_in(BLOCKING))
    if not blocking.select(pl.len()).collect().item():
        blocking = colls.lazy()  # no blocking kind recorded (unknown kinds, say): the best there is
    shared = blocking.group_by(KEYS).agg(n=pl.len()).filter(pl.col("n") > 1).select(KEYS)
    stride = (pl.len().over("run", "pg") // SAMPLE + 1).cast(pl.Int32)
    shared = shared.filter(pl.int_range(pl.len()).over("run", "pg", order_by="seq") % stride == 0)
    end = pl.col("ts_ns") + pl.col("dur_ns")
    return (
        blocking.join(shared, on=KEYS, how="semi")
        .select(*KEYS, "rank", end=(end - end.min().over("run")).cast(pl.Float64))
        .collect(engine="streaming")
    )


def _components(ends: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, anchor): the lowest rank each rank is connected to through process groups whose
    blocking collectives they share."""
    members = ends.lazy().select("run", "pg", "rank").unique().collect(engine="streaming")
    label = members.select("run", "rank").unique().with_columns(anchor=pl.col("rank"))
    for _ in range(64):
        per_pg = members.join(label, on=["run", "rank"]).group_by("run", "pg").agg(a=pl.col("anchor").min())
        new = members.join(per_pg, on=["run", "pg"]).group_by("run", "rank").agg(anchor=pl.col("a").min())
        if new.sort("run", "rank").equals(label.sort("run", "rank")):
            break
        label = new
    return label


def clock_offsets(colls: pl.DataFrame, align: bool = True) -> pl.DataFrame:
    """(run, rank, offset_ns): each rank's clock offset (float ns, null when it cannot be aligned);
    all 0 without `align`."""
    ranks = colls.select("run", "rank").unique()
    if not align:
        return ranks.with_columns(offset_ns=pl.lit(0.0))
    ends = _ends(colls)
    if not ends.height:
        return ranks.with_columns(offset_ns=pl.lit(None, pl.Float64))
    offsets = ends.select("run", "rank").unique().with_columns(offset=pl.lit(0.0))
    for _ in range(ROUNDS):  # streamed: each round groups every call of the run
        e = ends.lazy().join(offsets.lazy(), on=["run", "rank"])
        true_end = e.group_by(KEYS).agg(true_end=(pl.col("end") - pl.col("offset")).median())
        offsets = (
            e.join(true_end, on=KEYS)
            .group_by("run", "rank")
            .agg(offset=(pl.col("end") - pl.col("true_end")).median())
            .collect(engine="streaming")
        )
    anchored = offsets.join(_components(ends), on=["run", "rank"])
    zero = anchored.filter(pl.col("rank") == pl.col("anchor")).select("run", "anchor", base=pl.col("offset"))
    anchored = anchored.join(zero, on=["run", "anchor"]).select(
        "run", "rank", offset_ns=pl.col("offset") - pl.col("base")
    )
    return ranks.join(anchored, on=["run", "rank"], how="left")
