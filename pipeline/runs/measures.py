"""measures: what a run's matched collectives say, on clocks aligned (`clock`).

Per collective (pg, seq), over the ranks that recorded it:
- `n_ranks`: ranks in the collective (its group's size; the ranks present when unknown);
- `last_rank`: the rank that started last (ties: the lowest); `start_skew`: latest start - earliest;
- `wait` of a rank: latest start - its start (the time it spent waiting for the last one);
- `latency`: the shortest duration over the ranks (the part that is transfer, not waiting);
- `algbw` = bytes / latency and `busbw` = algbw x nccl-tests' factor (allreduce 2(n-1)/n;
  allgather, reducescatter, alltoall (n-1)/n; broadcast, reduce, send/recv 1), in GB/s (10^9).
Per rank: the wait it caused others (the sum, over collectives where it started last by at least
`LAST_BY` ns, of the other ranks' waits) and how often that was: the stragglers, ranked.
Per rank and step: the step's time, compute, communication and exposed communication (its
`steps` rows) and the time it waited in the collectives of that step.
"""

from __future__ import annotations

import polars as pl

from pipeline.cost.formulas.collectives import BUS_FACTOR

KEYS = ["run", "pg", "seq"]
LAST_BY = 1_000  # ns: a collective whose ranks started within 1 µs of each other has no straggler


def aligned(colls: pl.DataFrame, offsets: pl.DataFrame) -> pl.DataFrame:
    """Calls with their start on the lowest rank's clock (`a_ts`, float ns since the run's first
    start: an epoch-scale int64 would lose ns in a float). Offsets are looked up by (run, rank)
    rather than joined: a join would copy every call."""
    key = pl.col("run").to_physical().cast(pl.Int64) * (1 << 32) + pl.col("rank").cast(pl.Int64)
    table = offsets.select(k=key, v=pl.col("offset_ns").fill_null(0.0))
    offset = key.replace_strict(table["k"], table["v"], default=0.0, return_dtype=pl.Float64)
    base = pl.col("ts_ns").min().over("run")
    return colls.with_columns(a_ts=(pl.col("ts_ns") - base).cast(pl.Float64) - offset)


def _bus_factor(kind: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests' bus-bandwidth factor of each kind (`BUS_FACTOR`, applied to an expression)."""
    out = pl.lit(None, pl.Float64)
    for name, factor in BUS_FACTOR.items():
        value = factor(n)  # type: ignore[arg-type]  # the factors are arithmetic: they take an expression
        out = pl.when(kind == name).then(value if isinstance(value, pl.Expr) else pl.lit(value)).otherwise(out)
    return out


def _mode(col: str) -> pl.Expr:
    known = pl.col(col).filter(pl.col(col).is_not_null() & (pl.col(col).cast(pl.String) != "unknown"))
    return known.mode().sort().first()


def per_collective(calls: pl.DataFrame) -> pl.DataFrame:
    """One row per matched collective (see the module docstring); waits as a list beside ranks."""
    latest = pl.col("a_ts").max()
    by_rank = lambda col: pl.col(col).sort_by("rank")
    order = pl.col("rank").sort_by(["a_ts", "rank"], descending=[True, False])
    out = calls.group_by(KEYS).agg(
        kind=pl.coalesce(_mode("kind"), pl.lit("unknown")),
        bytes=_mode("bytes"),
        dtype=_mode("dtype"),
        step=pl.col("step").drop_nulls().mode().sort().first(),
        pg_size=pl.col("pg_size").max(),
        ranks=by_rank("rank"),
        waits_ns=latest - by_rank("a_ts"),
        rank_steps=by_rank("step"),
        present=pl.len().cast(pl.Int64),
        first_ns=pl.col("a_ts").min(),
        last_rank=order.first(),
        start_skew_ns=latest - pl.col("a_ts").min(),
        latency_ns=pl.col("dur_ns").min(),
    )
    n = pl.coalesce("pg_size", "present")
    algbw = pl.when((pl.col("latency_ns") > 0) & pl.col("bytes").is_not_null()).then(
        pl.col("bytes") / pl.col("latency_ns")
    )
    return (
        out.with_columns(n_ranks=n, algbw_gbps=algbw)
        .with_columns(busbw_gbps=pl.col("algbw_gbps") * _bus_factor(pl.col("kind"), pl.col("n_ranks")))
        .sort("run", "first_ns", "pg", "seq")
    )


def rank_waits(collectives: pl.DataFrame) -> pl.DataFrame:
    """(run, pg, seq, rank, step, wait_ns) of every call of every matched collective, `step` on that rank."""
    return (
        collectives.select(*KEYS, "ranks", "rank_steps", "waits_ns")
        .explode("ranks", "rank_steps", "waits_ns")
        .rename({"ranks": "rank", "rank_steps": "step", "waits_ns": "wait_ns"})
    )


def stragglers(collectives: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, wait_caused_ns, times_last): per rank, the others' waits in collectives it started
    last, and how many; largest first."""
    late = collectives.filter(pl.col("start_skew_ns") >= LAST_BY)
    caused = late.group_by("run", rank="last_rank").agg(
        wait_caused_ns=pl.col("waits_ns").list.sum().sum(), times_last=pl.len().cast(pl.Int64)
    )
    return caused.sort("run", "wait_caused_ns", "times_last", "rank", descending=[False, True, True, False])


def per_step(steps: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """Per run, rank and step: step_us, compute, communication, exposed communication (summed over
    the rank's devices) and the time waited in the step's collectives."""
    waited = (
        waits.lazy().group_by("run", "rank", "step").agg(wait_ns=pl.col("wait_ns").sum()).collect(engine="streaming")
    )
    s = steps.group_by("run", "rank", "step", maintain_order=True).agg(
        pl.col("step_ts_ns").first(),
        pl.col("step_end_ns").first(),
        *(pl.col(c).sum().alias(c) for c in ("compute_ns", "comm_ns", "exposed_comm_ns")),
        has_gpu=pl.col("device").is_not_null().any(),
    )
    s = s.with_columns(pl.when(pl.col("has_gpu")).then(pl.col(c)).alias(c) for c in ("compute_ns", "exposed_comm_ns"))
    return (
        s.join(waited, on=["run", "rank", "step"], how="left")
        .with_columns(step_ns=pl.col("step_end_ns") - pl.col("step_ts_ns"), wait_ns=pl.col("wait_ns").fill_null(0.0))
        .drop("has_gpu")
        .sort("run", "rank", "step_ts_ns")
    )
