"""facts: what the rules read of one trace, each made once and shared: the analyses' sections (as
`analyze` computed them, or computed on first use), and a few small reads of their own, made only
when a rule asks: the device's idle gaps, the CPU-side slices the rules look for (`marks`) and
the ops inside them (`inside`), what each kernel name ran at (`math_modes`), the kernels the
optimizer launched, and on a CPU-only trace which op made each copy (`callers`).

The bounds every estimate keeps live here too (`on_device`, `on_host`): a saving of device time
moves the window's wall time only as far as the device's work is on the critical path; a saving
of host time only as far as the host's is. No estimate exceeds the window's span, and no device
saving the device's busy time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np
import polars as pl

from pipeline.analyses.flat import Flat
from pipeline.analyses.intervals import nesting
from pipeline.analyses.sweep import read
from pipeline.findings import spans
from pipeline.findings.finding import Evidence, Range, capped, narrowed, pct, us
from pipeline.findings.limits import limits, marks
from pipeline.findings.vendor import trace_vendor, worded
from pipeline.kineto import CPU_OP_CAT
from pipeline.read.durations import SLICE


class Facts:
    """One trace as the rules see it. `section(name)` gives an analysis section's frame (the one
    `analyze` computed, or computed now)."""

    def __init__(self, f: Flat, section: Callable[[str], pl.DataFrame]):
        self.f = f
        self.section = section
        self._inside: dict[str, pl.DataFrame] = {}

    @staticmethod
    def limits(rule: str) -> dict:
        return limits(rule)

    # ------------------------------------------------------------------ the window
    @cached_property
    def has_device(self) -> bool:
        return self.f.has_gpu

    @cached_property
    def vendor(self) -> str:
        """The device vendor the trace ran on (`vendor.VENDORS`): picks each remedy's wording."""
        return trace_vendor(self.f)

    def worded(self, rule: str, key: str, **fill: str) -> str:
        """A rule's text for this trace's vendor (`vendor.worded`)."""
        return worded(rule, key, self.vendor, **fill)

    @cached_property
    def devices(self) -> pl.DataFrame:
        """The devices section's rows of devices (a CPU-only trace's CPU row too)."""
        return self.section("devices")

    @cached_property
    def bounds_ns(self) -> tuple[int, int]:
        """The window's first start and last end: of the CPU ops and the device activity."""
        first, last, _ = self.f.any_cpu().span
        starts = [v for v in (first, *self.devices["start_ns"].to_list()) if v is not None]
        ends = [v for v in (last, *self.devices["end_ns"].to_list()) if v is not None]
        return (min(starts), max(ends)) if starts and ends else (0, 0)

    @cached_property
    def span_us(self) -> float:
        a, b = self.bounds_ns
        return us(b - a)

    @cached_property
    def busy_us(self) -> float:
        """The devices' busy time (each device's union of activity), summed; 0 without a device."""
        if not self.has_device:
            return 0.0
        return float(self.devices.filter(pl.col("device") >= 0)["busy_us"].sum() or 0.0)

    @cached_property
    def kernels(self) -> pl.DataFrame:
        """The kernels section (a CPU-only trace: its CPU ops, device -1)."""
        return self.section("kernels")

    @cached_property
    def kernel_us(self) -> float:
        return float(self.kernels["dur_us"].sum() or 0.0)

    @cached_property
    def ops(self) -> pl.DataFrame:
        """The ops section per name (a grouping's rows summed)."""
        ops = self.section("ops")
        sums = [c for c in ("calls", "self_cpu_us", "cpu_total_us", "self_device_us", "kernels") if c in ops.columns]
        return ops.group_by("name").agg(pl.col(sums).sum()).sort("name")

    def kernel_evidence(
        self, k: pl.DataFrame, top: int, note: Callable[[dict], str | None] | None = None
    ) -> list[Evidence]:
        """The `top` rows of a kernels-section frame as evidence: name, count, time, share of kernel
        time, and a note (default: the op that launched it)."""
        note = note or (lambda r: f"launched by {r['cpu_op']}" if r.get("cpu_op") else None)
        return [
            Evidence(
                "kernel", r["name"], r["count"], r["dur_us"], pct(r["dur_us"], self.kernel_us), "kernel time", note(r)
            )
            for r in k.head(top).iter_rows(named=True)
        ]

    # ------------------------------------------------------------------ the critical path
    @cached_property
    def path(self) -> dict:
        """The critical path: length_us and breakdown_us (category -> µs)."""
        cp = self.section("critical-path")
        row = cp.row(0, named=True) if cp.height else {}
        if not row.get("length_us"):  # no work items (an older layout's CPU ops): the window bounds it
            return {"length_us": self.span_us, "breakdown_us": {}}
        return {"length_us": row["length_us"], "breakdown_us": dict(row["breakdown_us"] or {})}

    @cached_property
    def device_path_us(self) -> float:
        """Device work on the critical path (kernels, memcpy / memset)."""
        b = self.path["breakdown_us"]
        return float((b.get("kernel") or 0.0) + (b.get("memcpy") or 0.0)) if self.has_device else 0.0

    @cached_property
    def host_path_us(self) -> float:
        """Host time on the critical path: CPU ops, launches, syncs, and the waits between them."""
        return max(float(self.path["length_us"]) - self.device_path_us, 0.0)

    @cached_property
    def on_path_share(self) -> float:
        """The share of the device's busy time on the critical path (how far a device saving moves the wall)."""
        return min(self.device_path_us / self.busy_us, 1.0) if self.busy_us else 0.0

    def on_device(self, gpu: Range) -> Range:
        """The wall time a saving of device time buys: its share on the critical path, at most the
        path's device time."""
        share = self.on_path_share
        return capped((gpu[0] * share, gpu[1] * share), self.device_path_us)

    def on_host(self, wall: Range) -> Range:
        """A saving of host time, at most the host's time on the critical path (on a CPU-only
        trace, the path itself)."""
        return capped(wall, self.host_path_us if self.has_device else self.path["length_us"])

    def bounded(self, wall: Range, gpu: Range | None = None) -> tuple[Range, Range | None]:
        """The contract every finding keeps: high at most max_ratio x low, wall within the span,
        device time within the busy time."""
        ratio = limits("common")["max_ratio"]
        wall = narrowed(capped(wall, self.span_us), ratio)
        gpu = narrowed(capped(gpu, self.busy_us), ratio) if gpu is not None else None
        return wall, gpu

    def worth(self, wall: Range, gpu: Range | None = None) -> bool:
        """Whether a saving is worth saying (its high above [common] min_gain_span of the span and
        min_gain_us), of wall time or of device time."""
        c = limits("common")
        floor = max(c["min_gain_span"] * self.span_us, c["min_gain_us"])
        device_floor = max(c["min_gain_span"] * self.busy_us, c["min_gain_us"])
        return wall[1] >= floor or (gpu is not None and gpu[1] >= device_floor)

    # ------------------------------------------------------------------ reads of their own
    @cached_property
    def gaps(self) -> pl.DataFrame:
        """The device's idle gaps (no activity on any device) between its first start and last end:
        (start_ns, end_ns, host): host when the activity that ended the gap was launched after the
        gap began (the device waited for the host: HTA's host wait)."""
        schema = {"start_ns": pl.Int64, "end_ns": pl.Int64, "host": pl.Boolean}
        if not self.has_device:
            return pl.DataFrame(schema=schema)
        g = read(
            self.f.gpu_ops_file,
            pl.col("ts_ns").is_not_null() & self.f.time_filter(),
            ["ts_ns", pl.col("dur_ns").fill_null(0).clip(0), "launch_ts_ns"],
        ).sort("ts_ns")
        if g.height < 2:
            return pl.DataFrame(schema=schema)
        s = g["ts_ns"].to_numpy()
        e = s + g["dur_ns"].to_numpy()
        reach = np.maximum.accumulate(e)
        new = np.flatnonzero(s[1:] > reach[:-1]) + 1  # the first activity after each gap
        launch = g["launch_ts_ns"].to_numpy(allow_copy=True)
        start, end = reach[new - 1], s[new]
        host = np.zeros(len(new), bool) if launch is None else np.nan_to_num(launch[new].astype(float), nan=-1) > start
        return pl.DataFrame({"start_ns": start, "end_ns": end, "host": host}, schema=schema)

    @cached_property
    def idle_us(self) -> float:
        return us(self.gaps.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)

    @cached_property
    def host_wait(self) -> pl.DataFrame:
        return self.gaps.filter("host")

    @cached_property
    def host_idle_us(self) -> float:
        """The device's host-wait time no narrower cause explains: host-wait gaps that did not
        begin inside a synchronising call (`sync`), outside DataLoader fetches (`dataloader`)."""
        g = self.host_wait
        if not g.height:
            return 0.0
        g = g.filter(
            pl.Series(~spans.drained(self.mark_spans("sync"), g["start_ns"].to_numpy(), g["end_ns"].to_numpy()))
        )
        if not g.height:
            return 0.0
        loading = spans.covered(g["start_ns"].to_numpy(), g["end_ns"].to_numpy(), self.mark_spans("dataloader"))
        return us(int((g["end_ns"] - g["start_ns"]).sum()) - int(loading.sum()))

    @cached_property
    def launch_share(self) -> float:
        """The share of the host's critical-path time spent launching (launch calls and the delays
        from a launch to its kernel's start), when kernels run shorter than their launches
        ([small_kernels] min_shorter of them): the part of the host wait `small_kernels` claims;
        0 otherwise (it stays `host_bound`'s)."""
        if not self.has_device or not self.host_path_us:
            return 0.0
        lim = limits("small_kernels")
        launch = self.section("launch")
        if not launch.height or "shorter_than_launch_pct" not in launch.columns:
            return 0.0
        kernels = launch["kernels"].fill_null(0).cast(pl.Float64)
        weighted = float((launch["shorter_than_launch_pct"].fill_null(0.0) * kernels).sum() or 0.0)
        shorter = weighted / max(float(kernels.sum() or 0.0), 1.0)
        if shorter < 100 * lim["min_shorter"]:
            return 0.0
        return min(float(self.path["breakdown_us"].get("launch") or 0.0) / self.host_path_us, 1.0)

    @cached_property
    def marks(self) -> dict[str, pl.DataFrame]:
        """The CPU-side slices the rules look for (`limits.marks`), by key: one read of events."""
        patterns = marks()
        either = "|".join(f"(?:{p})" for p in patterns.values())
        ev = read(
            self.f.path / "events.parquet",
            SLICE
            & pl.col("ts_ns").is_not_null()
            & pl.col("name").str.contains(either)
            & ~pl.col("cat").fill_null("").str.to_lowercase().str.starts_with("gpu_")  # their GPU-timeline twins
            & self.f.time_filter(),
            [
                "name",
                "cat",
                "pid",
                "tid",
                "ts_ns",
                (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(0)).alias("end_ns"),
            ],
        )
        return {k: ev.filter(pl.col("name").str.contains(p)) for k, p in patterns.items()}

    def mark_spans(self, key: str) -> spans.Spans:
        m = self.marks[key]
        return spans.union(m["ts_ns"].to_numpy(), m["end_ns"].to_numpy())

    def idle_within(self, u: spans.Spans, gaps: pl.DataFrame | None = None) -> float:
        """µs of the device's idle gaps (default all; or `gaps`) inside the union u."""
        g = self.gaps if gaps is None else gaps
        return us(spans.covered(g["start_ns"].to_numpy(), g["end_ns"].to_numpy(), u).sum()) if g.height else 0.0

    @cached_property
    def optimizer_kernels(self) -> tuple[int, float]:
        """(count, µs) of the kernels launched inside optimizer steps ([marks] optimizer)."""
        u = self.mark_spans("optimizer")
        if not self.has_device or not len(u[0]):
            return 0, 0.0
        k = read(
            self.f.gpu_ops_file,
            (pl.col("kind") == "kernel")
            & pl.col("launch_ts_ns").is_between(int(u[0][0]), int(u[1][-1]))
            & self.f.time_filter(),
            ["launch_ts_ns", pl.col("dur_ns").fill_null(0)],
        )
        k = k.filter(pl.Series(spans.holding(u, k["launch_ts_ns"].to_numpy()))) if k.height else k
        return k.height, us(int(k["dur_ns"].sum() or 0))

    @cached_property
    def optimizer_ops_us(self) -> tuple[float, float]:
        """(total, self) µs of the optimizer steps' slices (the ops section's rows of their names):
        self is the Python between their ops, total - self the ops' time."""
        names = self.marks["optimizer"]["name"].unique().to_list()
        own = self.ops.filter(pl.col("name").is_in(names))
        return float(own["cpu_total_us"].sum() or 0.0), float(own["self_cpu_us"].sum() or 0.0)

    @cached_property
    def optimizer_inside(self) -> pl.DataFrame:
        """The CPU ops inside the optimizer steps (`inside`)."""
        return self.inside("optimizer")

    def inside(self, key: str) -> pl.DataFrame:
        """(name, n, top, us) of the CPU ops inside the slices of a mark (`marks`), on their threads:
        how many, how many run directly in the slices' Python (not nested in another op: one
        dispatch each), and their self time (µs)."""
        if key not in self._inside:
            self._inside[key] = self._ops_inside(key)
        return self._inside[key]

    def _ops_inside(self, key: str) -> pl.DataFrame:
        empty = pl.DataFrame(schema={"name": pl.String, "n": pl.Int64, "top": pl.Int64, "us": pl.Float64})
        m = self.marks[key]
        if not m.height:
            return empty
        u = self.mark_spans(key)
        threads = m.select("pid", "tid").unique()
        ops = read(
            self.f.path / "events.parquet",
            SLICE
            & pl.col("cat").str.contains(CPU_OP_CAT)
            & pl.col("ts_ns").is_between(int(u[0][0]), int(u[1][-1]))
            & self.f.time_filter(),
            [
                pl.col("event_idx").alias("iv_idx"),
                "name",
                "pid",
                "tid",
                "ts_ns",
                (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(0)).alias("end_ns"),
            ],
        ).join(threads, on=["pid", "tid"], how="semi")
        ops = ops.filter(pl.Series(spans.holding(u, ops["ts_ns"].to_numpy()))) if ops.height else ops
        if not ops.height:
            return empty
        nest = nesting(ops).collect()
        dur = (pl.col("end_ns") - pl.col("ts_ns")).alias("ns")
        ops = ops.join(nest, on="iv_idx", how="left").with_columns(dur)
        children = ops.group_by("parent_idx").agg(child_ns=pl.col("ns").sum())
        ops = ops.join(children, left_on="iv_idx", right_on="parent_idx", how="left")
        return ops.group_by("name").agg(
            n=pl.len().cast(pl.Int64),
            top=(pl.col("depth") == 1).sum().cast(pl.Int64),
            us=((pl.col("ns") - pl.col("child_ns").fill_null(0)).clip(0).sum() / 1e3).cast(pl.Float64),
        )

    @cached_property
    def cpu_nest(self) -> pl.DataFrame:
        """The CPU ops nested per thread (a trace without a device): iv_idx, name, parent_idx,
        parent (its name), self_ns. One read of the CPU ops, made when a rule asks."""
        ops = read(
            self.f.path / "events.parquet",
            SLICE & pl.col("cat").str.contains(CPU_OP_CAT) & pl.col("ts_ns").is_not_null() & self.f.time_filter(),
            [
                pl.col("event_idx").alias("iv_idx"),
                pl.col("name").cast(pl.String),
                "pid",
                "tid",
                "ts_ns",
                (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(0)).alias("end_ns"),
            ],
        )
        schema = {
            "iv_idx": pl.Int64,
            "name": pl.String,
            "parent_idx": pl.Int64,
            "parent": pl.String,
            "self_ns": pl.Int64,
        }
        if not ops.height:
            return pl.DataFrame(schema=schema)
        ops = ops.join(nesting(ops).collect(), on="iv_idx", how="left").with_columns(
            ns=pl.col("end_ns") - pl.col("ts_ns")
        )
        children = ops.group_by("parent_idx").agg(child_ns=pl.col("ns").sum())
        ops = ops.join(children, left_on="iv_idx", right_on="parent_idx", how="left")
        names = ops.select("iv_idx", parent="name")
        return ops.join(names, left_on="parent_idx", right_on="iv_idx", how="left").select(
            pl.col("iv_idx").cast(pl.Int64),
            "name",
            pl.col("parent_idx").cast(pl.Int64),
            "parent",
            self_ns=(pl.col("ns") - pl.col("child_ns").fill_null(0)).clip(0).cast(pl.Int64),
        )

    def under(self, rx: str, parent: str) -> tuple[int, float]:
        """(count, self µs) of the CPU ops whose names match `rx` called directly inside an op
        whose name matches `parent` (a trace without a device)."""
        n = self.cpu_nest
        m = n.filter(pl.col("name").str.contains(rx) & pl.col("parent").fill_null("").str.contains(parent))
        return m.height, us(int(m["self_ns"].sum() or 0))

    def callers(self, rx: str, family: str) -> pl.DataFrame:
        """(caller, n, us): the CPU ops whose names match `rx`, by the nearest op enclosing them
        whose name does not match `family` (null: called from Python), their self time (µs)
        (a trace without a device)."""
        ops = self.cpu_nest
        if not ops.height:
            return pl.DataFrame(schema={"caller": pl.String, "n": pl.Int64, "us": pl.Float64})
        up = ops.select("iv_idx", up_name="name", up_parent="parent_idx")
        mine = ops.filter(pl.col("name").str.contains(rx)).select(
            "self_ns",
            at=pl.col("parent_idx"),
            caller=pl.lit(None, pl.String),
        )
        for _ in range(16):  # climb while the enclosing op is one of the family
            open_ = mine.filter(pl.col("caller").is_null() & pl.col("at").is_not_null())
            if not open_.height:
                break
            mine = (
                mine.join(up, left_on="at", right_on="iv_idx", how="left")
                .with_columns(
                    caller=pl.when(pl.col("caller").is_null() & ~pl.col("up_name").str.contains(family))
                    .then("up_name")
                    .otherwise("caller"),
                    at=pl.when(pl.col("caller").is_null() & pl.col("up_name").str.contains(family)).then("up_parent"),
                )
                .drop("up_name", "up_parent")
            )
        return mine.group_by("caller").agg(
            n=pl.len().cast(pl.Int64), us=(pl.col("self_ns").sum() / 1e3).cast(pl.Float64)
        )

    @property
    def optimizer_op_count(self) -> int:
        return int(self.optimizer_inside["top"].sum() or 0)

    @cached_property
    def math_modes(self) -> pl.DataFrame | None:
        """(name, math_mode): the precision each kernel name ran at (gpu_ops.math_mode), None when
        the trace was costed before gpu_ops had it."""
        path = self.f.gpu_ops_file
        if "math_mode" not in pl.scan_parquet(path).collect_schema().names():
            return None
        return (
            pl.scan_parquet(path)
            .filter(pl.col("kind") == "kernel")
            .select(pl.col("name").cast(pl.String), pl.col("math_mode").cast(pl.String))
            .unique()
            .collect(engine="streaming")
        )

    @cached_property
    def spec(self) -> dict | None:
        """The device spec matched to the busiest device (peaks per precision, arch), None unknown."""
        from pipeline.cost.devices import load_specs

        if not self.has_device:
            return None
        names = self.f.activity.specs
        dev = self.devices.filter(pl.col("device") >= 0).sort("busy_us", descending=True)
        if not dev.height or not names.height:
            return None
        busiest = names.filter(pl.col("device") == dev["device"][0])["spec_name"]
        name = busiest[0] if busiest.len() else names["spec_name"][0]
        rows = load_specs().filter(pl.col("spec_name") == name)
        return rows.row(0, named=True) if rows.height else None
