"""sequences: the longest chains of consecutive kernels that repeat (fusion candidates).

Per stream, its kernels in start order (memcpy and memset skipped); every run of `seq_len` (N,
default 3) consecutive kernels is a window, overlapping ones counted (A B C D holds A B C and
B C D), over all streams of a device. Overlapping windows are merged into chains: a window and
the next one on its stream belong to one chain when every occurrence of the first is followed by
the second and every occurrence of the second follows the first (they occur together, as one
longer run). A chain is the longest such run: its count is how often it occurs (each of its
windows occurs exactly that often), its time that of all its kernels in every occurrence.
Chains that occur once are left out, but on a device whose kernels never repeat at all: there
each stream's run is its one chain (count 1). Per chain: its kernels, count, total time, its
share of the device's kernel time (`pct`), the mean gap between its consecutive kernels, and the
CPU op that launched its first kernel most often. Most frequent first (ties: more time).

A chain can hold GEMMs, convolutions or attention between elementwise kernels: a fusion rule
looks at the runs of fusible kernels within it.

A device whose streams all hold fewer than N kernels (but one holds two or more) uses windows of
its longest stream's length instead.

Streamed: one read of the kernels window by window in time (`activity_windows`), folded into
counts per distinct window and per pair of consecutive windows (a few thousand rows); the chains
are then followed over those tables.
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.gpu_order import STREAM, StreamCarry, activity_windows
from pipeline.analyses.sweep import fold

SEQ_LEN = 3
MIN_COUNT = 2  # a chain shown occurs at least this often (but on a device where nothing repeats)


def _names(n: int) -> list[str]:
    return [f"k{i}" for i in range(n)]


EMPTY = pl.Schema(
    {
        "device": pl.Int64(),
        "kernels": pl.List(pl.String()),
        "count": pl.Int64(),
        "dur_us": pl.Float64(),
        "pct": pl.Float64(),
        "mean_gap_us": pl.Float64(),
        "launched_by": pl.String(),
    }
)


class Windows:
    """Folded over the windows of time: per (device, window of n kernel names) its occurrences
    (`count`), summed time of its kernels (`dur_ns`) and inner gaps (`gap_ns`), summed time of and
    gap before its last kernel (`last_ns`, `last_gap_ns`); per (window, op of its first kernel) the
    occurrences (`ops`); per pair of consecutive windows on a stream, (device, `p0`: the kernel
    before the window, window) its occurrences (`pairs`); per device its kernel time (`kernel_ns`)."""

    def __init__(self, n: int):
        self.n = n
        self.keys = ["device", *_names(n)]
        self.carry = StreamCarry(n)
        self.counts: pl.DataFrame | None = None
        self.ops: pl.DataFrame | None = None
        self.pairs: pl.DataFrame | None = None
        self.kernel_ns: pl.DataFrame | None = None
        self.lengths: pl.DataFrame | None = None  # (device, stream, kernels): each stream's kernels

    def add(self, rows: pl.DataFrame):
        n, keys = self.n, self.keys
        new = ~pl.col("carried")
        self.lengths = fold(
            self.lengths, rows.group_by(STREAM).agg(kernels=pl.len()), STREAM, [pl.col("kernels").sum()]
        )
        self.kernel_ns = fold(
            self.kernel_ns, rows.group_by("device").agg(kernel_ns=pl.col("dur_ns").sum()), ["device"],
            [pl.col("kernel_ns").sum()],
        )  # fmt: skip
        rows = self.carry.prepend(rows)
        back = lambda col, i: pl.col(col).shift(i).over(STREAM)  # the value i kernels before, on the stream
        gap = pl.col("ts_ns") - back("end_ns", 1)  # the gap before each kernel
        occ = rows.with_columns(
            *(back("name", n - 1 - i).alias(f"k{i}") for i in range(n)),
            p0=back("name", n),
            dur=sum((back("dur_ns", i) for i in range(n)), pl.lit(0)),
            gap=sum((gap.shift(i).over(STREAM) for i in range(n - 1)), pl.lit(0)),
            last_gap=gap,
            op=back("cpu_op_name", n - 1),
        ).filter(new & pl.all_horizontal(pl.col(_names(n)).is_not_null()))
        sums = ["count", "dur_ns", "gap_ns", "last_ns", "last_gap_ns"]
        counts = occ.group_by(keys).agg(
            count=pl.len().cast(pl.Int64),
            dur_ns=pl.col("dur").sum(),
            gap_ns=pl.col("gap").sum(),
            last_ns=pl.col("dur_ns").sum(),
            last_gap_ns=pl.col("last_gap").fill_null(0).sum(),
        )
        self.counts = fold(self.counts, counts, keys, [pl.col(c).sum() for c in sums])
        ops = occ.filter(pl.col("op").is_not_null()).group_by(*keys, "op").agg(count=pl.len().cast(pl.Int64))
        self.ops = fold(self.ops, ops, [*keys, "op"], [pl.col("count").sum()])
        pairs = occ.filter(pl.col("p0").is_not_null()).group_by("p0", *keys).agg(count=pl.len().cast(pl.Int64))
        self.pairs = fold(self.pairs, pairs, ["p0", *keys], [pl.col("count").sum()])

    def chains(self) -> pl.DataFrame:
        """The chains (EMPTY's columns) the windows make."""
        if self.counts is None or self.counts.is_empty():
            return pl.DataFrame(schema=EMPTY)
        n, keys = self.n, self.keys
        w = self.counts.with_row_index("id")
        ids = w.select("id", *keys)
        pairs = self.pairs if self.pairs is not None else w.head(0).select(pl.col("k0").alias("p0"), *keys, "count")
        # the window each pair starts from: (p0, k0 .. k(n-2)), its names shifted by one
        shifted = {"k0": "p0", **{f"k{i + 1}": f"k{i}" for i in range(n - 1)}}
        pairs = pairs.join(ids.rename({"id": "to"}), on=keys).join(
            ids.rename({"id": "from", **shifted}), on=["device", *shifted.values()]
        )
        out_of = pairs.group_by("from").agg(succ=pl.len(), out=pl.col("count").sum(), to=pl.col("to").first())
        into = pairs.group_by("to").agg(pred=pl.len(), into=pl.col("count").sum())
        w = (
            w.join(out_of, left_on="id", right_on="from", how="left")
            .join(into, left_on="id", right_on="to", how="left")
            .join(w.group_by("device").agg(most=pl.col("count").max()), on="device")
            .with_columns(floor=pl.when(pl.col("most") >= MIN_COUNT).then(MIN_COUNT).otherwise(1))
        )
        # every occurrence of a window is followed by one same window, every occurrence of that one
        # preceded by it: they are one run
        alone_after = (pl.col("succ") == 1) & (pl.col("out") == pl.col("count"))
        alone_before = (pl.col("pred") == 1) & (pl.col("into") == pl.col("count"))
        shown = pl.col("count") >= pl.col("floor")
        w = w.with_columns(after=alone_after.fill_null(False), before=alone_before.fill_null(False))
        ok = dict(zip(w["id"].to_list(), (w["before"] & w["count"].ge(w["floor"])).to_list(), strict=True))
        nxt = {
            i: t for i, t, a, s in w.select("id", "to", "after", shown.alias("s")).iter_rows() if a and s and ok.get(t)
        }
        linked = set(nxt.values())
        starts = w.filter(shown & ~pl.col("id").is_in(list(linked)))["id"].to_list()
        chain_of: list[tuple[int, int, int]] = []  # (chain, position, window id)
        for c, start in enumerate(starts):
            i, pos = start, 0
            while True:
                chain_of.append((c, pos, i))
                pos += 1
                if i not in nxt or pos > len(nxt):
                    break
                i = nxt[i]
        steps = pl.DataFrame(chain_of, schema={"chain": pl.Int64, "pos": pl.Int64, "id": pl.UInt32}, orient="row")
        steps = steps.join(w, on="id").sort("chain", "pos")
        first = pl.col("pos") == 0
        # the kernels each window adds to its chain: the first all of its own, the others their last
        added = pl.when(first).then(pl.concat_list(_names(n))).otherwise(pl.concat_list(f"k{n - 1}"))
        steps = steps.with_columns(added=added)
        top_op = pl.DataFrame(schema={"id": pl.UInt32, "op": pl.String})
        if self.ops is not None and self.ops.height:
            by_count = self.ops.join(ids, on=keys).sort("count", "op", descending=[True, False])
            top_op = by_count.group_by("id", maintain_order=True).agg(op=pl.col("op").first())
        per_chain = (
            steps.join(top_op, on="id", how="left")
            .group_by("chain", maintain_order=True)
            .agg(
                device=pl.col("device").first(),
                kernels=pl.col("added").list.explode(keep_nulls=False, empty_as_null=False),
                count=pl.col("count").first(),
                dur_ns=pl.col("dur_ns").filter(first).sum() + pl.col("last_ns").filter(~first).sum(),
                gap_ns=pl.col("gap_ns").filter(first).sum() + pl.col("last_gap_ns").filter(~first).sum(),
                launched_by=pl.col("op").filter(first).first().cast(pl.String),
            )
        )
        kernel_ns = self.kernel_ns if self.kernel_ns is not None else pl.DataFrame(schema={"device": pl.Int64})
        steps_in = pl.col("kernels").list.len() - 1
        return (
            per_chain.join(kernel_ns, on="device", how="left")
            .select(
                "device",
                kernels=pl.col("kernels").cast(pl.List(pl.String)),
                count="count",
                dur_us=pl.col("dur_ns") / 1e3,
                pct=pl.when(pl.col("kernel_ns") > 0).then(100 * pl.col("dur_ns") / pl.col("kernel_ns")),
                mean_gap_us=pl.when(steps_in > 0).then(pl.col("gap_ns") / (pl.col("count") * steps_in) / 1e3),
                launched_by="launched_by",
            )
            .cast(EMPTY)
        )


def sequences(flat, seq_len: int = SEQ_LEN) -> pl.DataFrame:
    """(device, kernels, count, dur_us, pct, mean_gap_us, launched_by): the repeated chains of
    kernels (see the module docstring), most frequent first (ties: more time, then names)."""
    f: Flat = as_flat(flat)
    n = max(2, seq_len)
    found, lengths = _of_length(f, n)
    out = [found]
    longest = lengths.group_by("device").agg(pl.col("kernels").max())  # each device's longest stream
    short = longest.filter(~pl.col("device").is_in(found["device"].implode()) & pl.col("kernels").is_between(2, n - 1))
    for (m,), devices in short.group_by("kernels"):
        out.append(_of_length(f, int(m), devices["device"].to_list())[0])
    return pl.concat(out).sort("device", "count", "dur_us", "kernels", descending=[False, True, True, False])


def _of_length(f: Flat, n: int, devices: list | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The chains of windows of `n` kernels (of `devices` only, when given), and (device, stream,
    kernels): how many kernels each stream holds, counted in the same pass."""
    windows = Windows(n)
    names = pl.col("name").cast(pl.Categorical)  # long kernel names: a small id per row
    where = pl.col("kind") == "kernel"
    if devices is not None:
        where = where & pl.col("device").is_in(devices)
    for rows in activity_windows(f, [names, "dur_ns", "cpu_op_name"], where):
        windows.add(rows)
    lengths = windows.lengths
    if lengths is None:
        lengths = pl.DataFrame(schema={"device": pl.Int64, "stream": pl.Int64, "kernels": pl.UInt32})
    return windows.chains(), lengths
