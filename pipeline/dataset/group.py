"""group: many traces flattened in one task into one set of tables keyed by `trace_id`, each
trace's rows exactly those `flatten` gives it alone.

A small trace costs `flatten` ~90 ms, almost all of it fixed costs (a few hundred polars queries
to link and cost it, seven Parquet files to write), while its bytes take ~1 ms. So the small
traces of a task are read one by one but decoded together (their events texts joined into one
chunk, a sentinel event between two: `_decode`), linked and costed together (`_link_and_cost`)
and written together, and every per-trace result of the single-trace path is kept:

* linking runs over the group's events with every id a join matches on made unique per trace:
  pid (a thread is (pid, tid)), correlation, External id and flow ids are moved to the trace's
  band (`BAND` apart; a trace whose ids do not fit a band goes alone) and event_idx is offset.
  What linking decides once per trace (whether External ids are trustworthy, whether every GPU
  op carries a correlation id: `_link_facts`) splits the group so that each part agrees on it;
* kernels are costed against their own trace's devices (traces with the same devices together);
* counts (links, costs, problems), facts and the run tables are computed per trace (`steps` by
  one query keyed by trace; a trace with collectives gets both from `write_run_tables` itself).

A trace that is not small after all (a long text, truncated, an oversized value), that fails to
decode, or a large one (`run_group(small=False)`) is flattened alone by `flatten` into a scratch
directory and copied in. Part files hold whole traces in trace_id order, each trace's rows in
their `flatten` order (`PartWriter`). `tests/test_scale.py` checks, table by table, that a trace
flattened in a group equals it flattened alone, on real and synthetic traces.
"""

from __future__ import annotations

import gc
import io
import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import schema, store
from pipeline.dataset.layout import KEY, TABLES
from pipeline.dataset.members import Member, quarantine_message, read_text, utc_now
from pipeline.dataset.parts import PART_ROW_GROUP_ROWS, PartWriter
from pipeline.errors import OutputError, TracepipeError

FAULT_KILL = "TRACEPIPE_FAULT_KILL"  # tests: a worker given an input whose name holds this value dies

BAND = 1 << 40  # the ids of the k-th trace of a group move to the band k * BAND
ID_LIMIT = 1 << 39  # ids within +-ID_LIMIT fit a band
SENTINEL = b'{"ph":"tracepipe:next-trace"}'  # between two traces' events in a joined chunk
_SENTINEL_PH = "tracepipe:next-trace"

# the columns linking matches on, per table: moved to their trace's band
_BANDED = {
    "events": ("pid", "correlation", "external_id"),
    "gpu_ops": ("pid", "correlation", "external_id"),
    "flows": ("pid", "id"),
}
_READ_TABLES = ("events", "gpu_ops", "flows")


def _repeat(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


# ------------------------------------------------------------------ the group's tables
@dataclass
class Tables:
    """The events, gpu_ops and flows of a group's members, member after member (each member's rows
    in its own order, event_idx its own), and the member of each row (`owner`)."""

    tables: dict[str, pa.Table]
    owner: dict[str, np.ndarray]  # int64 member index of each row
    n: int  # members

    def counts(self, name: str) -> np.ndarray:
        return np.bincount(self.owner[name], minlength=self.n)

    def starts(self, name: str) -> np.ndarray:
        """The first row of each member (and the end, last)."""
        return np.concatenate([[0], np.cumsum(self.counts(name))])


def _build(text: bytes):
    from pipeline.read.decode import build_from_text

    return build_from_text(text)


DECODE_BYTES = 4 << 20  # events text decoded at once (the decode holds several times its size)


def _concat(parts: list[Tables]) -> Tables:
    """Tables of consecutive groups of members as one."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return Tables({n: _empty(n) for n in _READ_TABLES}, {n: np.zeros(0, np.int64) for n in _READ_TABLES}, 0)
    tables = {n: pa.concat_tables([p.tables[n] for p in parts]) for n in _READ_TABLES}
    first = np.cumsum([0, *(p.n for p in parts)])
    owner = {n: np.concatenate([p.owner[n] + f for p, f in zip(parts, first)]) for n in _READ_TABLES}
    return Tables(tables, owner, int(first[-1]))


def _decode_some(members: list[Member]) -> tuple[list[Member], Tables]:
    """The tables of a few members, decoded: their texts joined into one chunk (a sentinel event
    between two) when that decodes without any problem, else one by one (each with its own
    problems; a member whose text does not decode goes alone). Returns the members decoded."""
    from pipeline.read.chunks import ChunkParseError
    from pipeline.read.values import Problems

    with_text = [m for m in members if m.text]
    if len(with_text) > 1:
        try:
            texts = [x for m in with_text for x in (m.text or b"", SENTINEL)]
            joined = _build(b",".join(texts[:-1]))
        except (ChunkParseError, RecursionError, ValueError):
            joined = None
        if joined is not None and not (joined.problems.coerced or joined.problems.dropped):
            cuts = pc.indices_nonzero(pc.fill_null(pc.equal(joined.events.column("ph"), _SENTINEL_PH), False))
            if len(cuts) == len(with_text) - 1:
                for m in members:
                    m.problems, m.text = Problems(), None
                return members, _split_joined(joined, cuts.to_numpy(), members, with_text)
    decoded, parts = [], []
    for m in members:
        if not m.text:
            m.problems = Problems()
            ct_tables = {n: _empty(n) for n in _READ_TABLES}
        else:
            try:
                ct = _build(m.text)
            except (ChunkParseError, RecursionError, ValueError):
                m.alone, m.text = True, None
                continue
            m.problems = ct.problems
            ct_tables = {"events": ct.events, "gpu_ops": ct.gpu_ops, "flows": ct.flows}
        m.text = None
        decoded.append(m)
        parts.append(ct_tables)
    tables = {n: pa.concat_tables([p[n] for p in parts]) if parts else _empty(n) for n in _READ_TABLES}
    owner = {n: np.repeat(np.arange(len(parts), dtype=np.int64), [p[n].num_rows for p in parts]) for n in _READ_TABLES}
    return decoded, Tables(tables, owner, len(decoded))


def _split_joined(joined, cuts: np.ndarray, members: list[Member], with_text: list[Member]) -> Tables:
    """The Tables of a joined chunk: sentinel rows dropped, event_idx made each member's own."""
    n_ev = joined.events.num_rows
    lo = np.concatenate([[0], cuts + 1])  # first event of each member with a text
    hi = np.concatenate([cuts, [n_ev]])
    index = {id(m): k for k, m in enumerate(members)}
    member_of_text = np.array([index[id(m)] for m in with_text], dtype=np.int64)
    tables, owner = {}, {}
    for name in _READ_TABLES:
        t = joined.events if name == "events" else getattr(joined, name)
        if name == "events":
            keep = np.ones(n_ev, dtype=bool)
            keep[cuts] = False
            t = t.filter(pa.array(keep))
        idx = t.column("event_idx").to_numpy()
        k = np.searchsorted(hi, idx, side="left")  # the text whose [lo, hi) holds the event
        t = t.set_column(t.schema.get_field_index("event_idx"), "event_idx", pa.array(idx - lo[k], pa.int64()))
        tables[name], owner[name] = t, member_of_text[k]
    return Tables(tables, owner, len(members))


def _empty(name: str) -> pa.Table:
    return schema.table(name).arrow_schema().empty_table()


def _empty_stage(name: str) -> pa.Table:
    return schema.table(name).arrow_schema(schema.ALL_STAGES).empty_table()


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")  # what `scrub` may have to fix


def _finish_read(members: list[Member], t: Tables, memo: dict):
    """The rest of `flatten_into` per member: metadata scrubbed, devices, the trace row. Members
    whose deviceProperties text and device ids are the same share one devices table (`memo`)."""
    from pipeline.read.metadata import devices_table, trace_row
    from pipeline.read.source import Tail
    from pipeline.read.tame import BAD_UNICODE, scrub
    from pipeline.read.values import Problems

    gpu = t.tables["gpu_ops"]
    device_ids: list[set] = [set() for _ in members]
    if gpu.num_rows:
        pairs = pl.DataFrame({"m": t.owner["gpu_ops"], "device": store.series_from_arrow(gpu.column("device"))})
        for k, d in pairs.drop_nulls().unique().iter_rows():
            device_ids[k].add(d)
    counts = {n: t.counts(n) for n in _READ_TABLES}
    for k, m in enumerate(members):
        if m.raw_metadata is None or _SURROGATE_ESCAPE.search(m.raw_metadata):
            m.metadata, bad_strings = scrub(m.metadata)
            if bad_strings:
                m.problems.coerced[BAD_UNICODE] += bad_strings
        key = None if m.raw_devices is None else (m.raw_devices, frozenset(device_ids[k]))
        if key is None or key not in memo:
            added = Problems()
            devices = devices_table(m.metadata, device_ids[k], added)
            if key is not None:
                memo[key] = (devices, added)
        else:
            devices, added = memo[key]
        m.problems.merge(added)
        m.devices, m.devices_key = devices, key
        n = {
            "n_events": int(counts["events"][k]),
            "n_gpu_ops": int(counts["gpu_ops"][k]),
            "n_flows": int(counts["flows"][k]),
            "n_devices": devices.num_rows,
        }
        m.row = trace_row(m.path, m.metadata, n, m.problems, Tail())
        m.metadata = {}


def _fits(t: Tables) -> np.ndarray:
    """Per member, whether the ids linking matches on fit a band."""
    ok = np.ones(t.n, dtype=bool)
    for name, cols in _BANDED.items():
        tbl = t.tables[name]
        if not tbl.num_rows:
            continue
        for c in cols:
            v = tbl.column(c).to_numpy(zero_copy_only=False)
            if v.dtype.kind == "f":  # nulls: a float array with NaN
                bad = ~np.isnan(v) & ((v <= -ID_LIMIT) | (v >= ID_LIMIT))
            else:
                bad = (v <= -ID_LIMIT) | (v >= ID_LIMIT)
            if bad.any():
                ok[np.unique(t.owner[name][bad])] = False
    return ok


def _link_facts(t: Tables) -> list[tuple[bool, bool]]:
    """What `LinkSources.of` decides once per trace from its GPU ops, per member: (every GPU op has
    a correlation id, kernels' External ids are trustworthy)."""
    g = pl.DataFrame(
        {
            "m": t.owner["gpu_ops"],
            "correlation": store.series_from_arrow(t.tables["gpu_ops"].column("correlation")),
            "external_id": store.series_from_arrow(t.tables["gpu_ops"].column("external_id")),
        }
    )
    facts = dict.fromkeys(range(t.n), (True, False))  # no GPU ops: none missing, differ None
    per = g.group_by("m").agg(
        missing=pl.col("correlation").null_count(), differ=(pl.col("external_id") != pl.col("correlation")).mean()
    )
    for k, missing, differ in per.iter_rows():
        facts[k] = (missing == 0, differ is not None and differ >= 0.5)
    return [facts[k] for k in range(t.n)]


# ------------------------------------------------------------------ link and cost
_SPECS: dict = {}


def _specs():
    if "bundled" not in _SPECS:
        from pipeline.cost import devices as device_specs_mod

        _SPECS["bundled"] = device_specs_mod.load_specs(None)
    return _SPECS["bundled"]


def _matched_devices(m: Member, memo: dict) -> tuple[pl.DataFrame, list[str], pa.Table]:
    """`enrich.matched_devices` of a member's devices table (and it as Arrow), memoised by what the
    table is made of."""
    from pipeline.cost import devices as device_specs_mod
    from pipeline.cost.enrich import resolve_devices

    key = m.devices_key if m.devices_key is not None else id(m)
    if key not in memo:
        buf = io.BytesIO()
        pq.write_table(schema.conform(m.devices, "devices", ("flatten",)), buf)  # read back as `enrich` reads it
        devs = resolve_devices(pl.read_parquet(io.BytesIO(buf.getvalue())))
        out, warnings = device_specs_mod.match_specs(devs.drop("inferred"), _specs(), force=None)
        out = out.with_columns(
            spec_match=pl.when(devs["inferred"] & (pl.col("spec_match") != "unknown"))
            .then(pl.lit("inferred"))
            .otherwise(pl.col("spec_match"))
        )
        memo[key] = (out, warnings, out.to_arrow())
    return memo[key]


def _banded(tbl: pa.Table, name: str, owner: np.ndarray, offsets: np.ndarray) -> pa.Table:
    """A table of the group for linking: event_idx offset per member, ids moved to its band."""
    if not tbl.num_rows:
        return tbl
    i = tbl.schema.get_field_index("event_idx")
    tbl = tbl.set_column(i, "event_idx", pa.array(tbl.column(i).to_numpy() + offsets[owner], pa.int64()))
    band = pa.array(owner * BAND, pa.int64())
    for c in _BANDED[name]:
        j = tbl.schema.get_field_index(c)
        tbl = tbl.set_column(j, c, pc.add(tbl.column(j), band))
    return tbl


def _select(tbl: pa.Table, rows: np.ndarray) -> pa.Table:
    return tbl.take(pa.array(rows, pa.int64()))


def _link_and_cost(t: Tables, part: np.ndarray, work: Path, matched: list) -> pl.DataFrame:
    """The link and cost columns (`links.LINK_COLUMNS`, `enrich.COST_COLUMNS`) of the GPU ops of the
    members `part` (which agree on the per-trace link facts), as `enrich` gives them: one pass
    over their tables. Rows in the group's gpu_ops order with `_row` (their row there), `_m`,
    and the columns the counts read (kind, dur_ns, correlation)."""
    from pipeline.cost.categories import CategoryMemo, with_category
    from pipeline.cost.enrich import (
        COST_COLUMNS,
        COST_INPUTS,
        KERNEL_INPUTS,
        OP_COST_COLUMNS,
        OpKernels,
        kernel_costs,
        op_costs,
    )
    from pipeline.link import links as link

    whole = len(part) == t.n
    in_part = np.zeros(t.n, dtype=bool)
    in_part[part] = True
    rows = {n: np.flatnonzero(in_part[t.owner[n]]) for n in _READ_TABLES}
    n_events = np.bincount(t.owner["events"], minlength=t.n) * in_part
    offsets = np.concatenate([[0], np.cumsum(n_events)[:-1]])
    work.mkdir(parents=True, exist_ok=True)
    for name in _READ_TABLES:
        tbl = t.tables[name] if whole else _select(t.tables[name], rows[name])
        owner = t.owner[name][rows[name]]
        store.write_table(_banded(tbl, name, owner, offsets), work / f"{name}.parquet", name, ("flatten",))
    op_kernels, memo = OpKernels(), CategoryMemo()
    evaluated: dict = {}  # shapes' costs, shared by the batches (`op_costs`)
    events = pl.scan_parquet(work / "events.parquet")
    declared = {f.name: f for f in schema.table("gpu_ops").arrow_schema(schema.ALL_STAGES)}
    op_cost_types = {"op_flops": pa.float64(), "op_bytes": pa.float64()}
    fields = [
        pa.field("event_idx", pa.int64()),
        *schema.table("gpu_ops").arrow_schema(("link",)),
        *(pa.field(c, op_cost_types.get(c, pa.string())) for c in OP_COST_COLUMNS),
        *(declared[c] for c in KERNEL_INPUTS),
    ]
    spill = work / "links.arrow"
    with store.SpillWriter(spill, fields) as out:  # as `enrich` spills its pass 1 (read back whole)
        for links in link.link_batches(work, carry=tuple(COST_INPUTS)):
            op_kernels.add(links)
            ops = op_costs(events, links["cpu_op_event_idx"], None, evaluated)
            out.write(
                with_category(links.join(ops, on="cpu_op_event_idx", how="left", maintain_order="left"), memo=memo)
            )
    with store.SpillReader(spill) as reader:
        spilled = reader.take(1 << 62)
    gpu_rows = rows["gpu_ops"]
    if spilled.height != len(gpu_rows):
        raise RuntimeError(f"linking gave {spilled.height} rows for {len(gpu_rows)} GPU ops")
    owner = t.owner["gpu_ops"][gpu_rows]
    gpu = t.tables["gpu_ops"]
    correlation = store.series_from_arrow((gpu if whole else _select(gpu, gpu_rows)).column("correlation"))
    spilled = spilled.with_columns(
        _row=pl.Series(gpu_rows, dtype=pl.Int64),
        _m=pl.Series(owner, dtype=pl.Int64),
        _offset=pl.Series(offsets[owner], dtype=pl.Int64),
        correlation=correlation,
    )
    by_devices: dict[int, list[int]] = {}  # members with the same devices are costed together
    for k in part:
        by_devices.setdefault(id(matched[k][0]), []).append(int(k))
    pieces = []
    for ks in by_devices.values():
        chunk = spilled.filter(pl.col("_m").is_in(ks)) if len(by_devices) > 1 else spilled
        g = chunk.select(*KERNEL_INPUTS, "cpu_op_event_idx", *OP_COST_COLUMNS)
        costed = kernel_costs(g, op_kernels.of(g["cpu_op_event_idx"]), matched[ks[0]][0])
        pieces.append(
            chunk.select("_row", "_m", "kind", "dur_ns", "correlation", *link.LINK_COLUMNS)
            .with_columns(pl.col(c) - chunk["_offset"] for c in ("launch_event_idx", "cpu_op_event_idx"))
            .hstack(costed.select(COST_COLUMNS))
        )
    return pl.concat(pieces).sort("_row") if len(pieces) > 1 else pieces[0]


def _tallies(linked: pl.DataFrame, n: int) -> list:
    """Per member, the `enrich.Tally` of its linked and costed GPU ops (`link.link_counts`,
    `Tally.add_links`, `Tally.add_costs`), from one query over the group."""
    from pipeline.cost.enrich import Tally
    from pipeline.link import links as link

    out = [Tally() for _ in range(n)]
    keys = list(link.link_counts(_LINK_COUNT_SAMPLE))
    for t in out:
        t.links.update(dict.fromkeys(keys, 0))
    if linked.is_empty():
        return out
    launched = pl.col("launch_event_idx").is_not_null()
    is_kernel = pl.col("kind") == "kernel"
    costed = pl.col("flops").is_not_null()
    dur = pl.col("dur_ns").fill_null(0)
    counts = linked.group_by("_m").agg(  # link_counts' reasons, in its order, then Tally's counts
        by_flow=(pl.col("launch_link") == "flow").sum(),
        by_corr=(pl.col("launch_link") == "correlation").sum(),
        no_launch_with_corr=(~launched & pl.col("correlation").is_not_null()).sum(),
        no_corr=(~launched & pl.col("correlation").is_null()).sum(),
        op_nesting=(pl.col("cpu_op_link") == "nesting").sum(),
        op_external=(pl.col("cpu_op_link") == "external_id").sum(),
        launch_outside_op=(launched & pl.col("cpu_op_event_idx").is_null()).sum(),
        n_launch_linked=launched.sum(),
        n_cpu_op_linked=pl.col("cpu_op_event_idx").is_not_null().sum(),
        n_kernels=is_kernel.sum(),
        n_costed=(is_kernel & costed).sum(),
        kernel_ns=dur.filter(is_kernel).sum(),
        modelled_ns=dur.filter(is_kernel & costed).sum(),
    )
    assert len(keys) == 7
    for r in counts.iter_rows():
        t = out[r[0]]
        t.links.update(dict(zip(keys, r[1:8])))
        t.n_launch_linked, t.n_cpu_op_linked, t.n_kernels, t.n_costed, t.kernel_ns, t.modelled_ns = map(int, r[8:])
    reasons = linked.filter(is_kernel & ~costed).group_by("_m", "unmodelled_reason").len()
    for k, reason, count in reasons.iter_rows():
        out[k].unmodelled[f"unmodelled:{reason}"] += count
    return out


_LINK_COUNT_SAMPLE = pl.DataFrame(
    schema={
        "launch_link": pl.String,
        "launch_event_idx": pl.Int64,
        "correlation": pl.Int64,
        "cpu_op_link": pl.String,
        "cpu_op_event_idx": pl.Int64,
    }
)


def _link_all(members: list[Member], t: Tables, work: Path) -> pa.Table:
    """Link and cost every member's GPU ops (`_link_and_cost`, once per part of the group that
    agrees on the link facts); give each member its matched devices, warnings and counts. Returns
    the group's gpu_ops with every column."""
    from pipeline.cost.enrich import COST_COLUMNS
    from pipeline.link import links as link

    memo: dict = {}
    matched = [_matched_devices(m, memo) for m in members]
    parts: dict[tuple[bool, bool], list[int]] = {}
    for k, facts in enumerate(_link_facts(t)):
        parts.setdefault(facts, []).append(k)
    linked = pl.concat(
        [_link_and_cost(t, np.array(ks), work / f"link-{i}", matched) for i, ks in enumerate(parts.values())]
    )
    if len(parts) > 1:
        linked = linked.sort("_row")
    for k, (m, tally) in enumerate(zip(members, _tallies(linked, len(members)))):
        m.devices, m.warnings = matched[k][2], m.warnings + matched[k][1]
        tally.row_update(m.row)
    gpu = t.tables["gpu_ops"]
    extra = linked.select(*link.LINK_COLUMNS, *COST_COLUMNS).to_arrow()
    for col in extra.column_names:
        gpu = gpu.append_column(col, extra.column(col))
    return schema.conform(gpu, "gpu_ops", schema.ALL_STAGES)


# ------------------------------------------------------------------ run tables
def _run_tables(members: list[Member], t: Tables, work: Path) -> tuple[pa.Table, np.ndarray, pa.Table, np.ndarray]:
    """The `collectives` and `steps` tables of the group (and the member of each row), as
    `write_run_tables` writes them per trace: a member with NCCL/RCCL kernels or gloo work gets
    them from `write_run_tables` itself (over a scratch directory of its tables); the others have
    no collectives, and their steps come from one query keyed by member (`runs.steps.steps`)."""
    from pipeline.kineto import ANNOTATION_CATS, STEP_NAME
    from pipeline.runs.collectives import GLOO_WORK, NCCL_KERNEL
    from pipeline.runs.steps import SCHEMA as STEPS_SCHEMA
    from pipeline.runs.steps import union_ns
    from pipeline.runs.tables import write_run_tables

    ev, gpu = t.tables["events"], t.tables["gpu_ops"]
    events = store.frame_from_arrow(ev.select(["cat", "name", "ts_ns", "dur_ns"])).with_columns(
        _m=pl.Series(t.owner["events"], dtype=pl.Int64)
    )
    kernels = store.frame_from_arrow(
        gpu.select(["kind", "name", "device", "ts_ns", "dur_ns", "category"])
    ).with_columns(_m=pl.Series(t.owner["gpu_ops"], dtype=pl.Int64))
    annotation = pl.col("cat").str.to_lowercase().is_in(ANNOTATION_CATS) & pl.col("ts_ns").is_not_null()
    gloo = events.filter(annotation & pl.col("name").str.contains(GLOO_WORK))["_m"]
    nccl = kernels.filter(
        (pl.col("kind") == "kernel") & pl.col("name").str.contains(NCCL_KERNEL) & pl.col("ts_ns").is_not_null()
    )["_m"]
    alone = sorted(set(gloo.to_list()) | set(nccl.to_list()))
    got: dict[str, dict[int, pa.Table]] = {"collectives": {}, "steps": {}}
    starts = {n: t.starts(n) for n in ("events", "gpu_ops")}
    for k in alone:
        m, d = members[k], work / f"runs-{k}"
        d.mkdir(parents=True)
        for name, tbl in (("events", ev), ("gpu_ops", gpu)):
            rows = tbl.slice(starts[name][k], starts[name][k + 1] - starts[name][k])
            store.write_table(
                rows, d / f"{name}.parquet", name, ("flatten",) if name == "events" else schema.ALL_STAGES
            )
        write_run_tables(d, m.row)
        for name in got:
            got[name][k] = pq.read_table(d / f"{name}.parquet")
        shutil.rmtree(d, ignore_errors=True)
    rest = [k for k in range(len(members)) if k not in set(alone)]
    for k in rest:
        members[k].row["n_collectives"] = 0
    intervals = (
        events.filter(pl.col("_m").is_in(rest) & annotation & pl.col("name").str.contains(STEP_NAME))
        .select("_m", step="name", step_ts_ns="ts_ns", step_end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0))
        .sort("_m", "step_ts_ns")
    )
    k_rows = kernels.filter(pl.col("_m").is_in(rest) & (pl.col("kind") == "kernel") & pl.col("ts_ns").is_not_null())
    k_rows = k_rows.select(
        "_m",
        "device",
        "ts_ns",
        end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0),
        comm=pl.col("category").fill_null("") == "communication",
    )
    with_kernels = k_rows["_m"].unique()
    by = ["_m", "step", "device"]
    k_in = (
        k_rows.sort("ts_ns")
        .join_asof(
            intervals.sort("step_ts_ns"),
            left_on="ts_ns",
            right_on="step_ts_ns",
            by="_m",
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(step=pl.when(pl.col("ts_ns") <= pl.col("step_end_ns")).then(pl.col("step")))
        .drop("step_ts_ns", "step_end_ns")
        .filter(pl.col("step").is_not_null())
    )
    covered = k_in.lazy().select(by).unique()
    for name, lf in (
        ("kernel_ns", union_ns(k_in, by)),
        ("compute_ns", union_ns(k_in.filter(~pl.col("comm")), by)),
        ("comm_ns", union_ns(k_in.filter(pl.col("comm")), by)),
    ):
        covered = covered.join(lf.rename({"covered_ns": name}), on=by, how="left")
    covered = covered.with_columns(pl.col("kernel_ns", "compute_ns", "comm_ns").fill_null(0))
    with_k = covered.with_columns(exposed_comm_ns=pl.col("kernel_ns") - pl.col("compute_ns")).collect()
    cpu_only = intervals.filter(~pl.col("_m").is_in(with_kernels.implode())).select(
        "_m",
        "step",
        device=pl.lit(None, pl.Int64),
        kernel_ns=pl.lit(None, pl.Int64),
        compute_ns=pl.lit(None, pl.Int64),
        comm_ns=pl.lit(0, pl.Int64),
        exposed_comm_ns=pl.lit(None, pl.Int64),
    )
    rows = pl.concat([with_k.select(cpu_only.columns), cpu_only], how="vertical_relaxed")
    steps = (
        intervals.join(rows, on=["_m", "step"], how="left")
        .select("_m", *(pl.col(c).cast(dt) for c, dt in STEPS_SCHEMA.items()))
        .sort("_m", "step_ts_ns", "device", nulls_last=True)
    )
    if alone:  # in member order, those of the members run alone in their places
        steps_parts = [steps.filter(~pl.col("_m").is_in(alone))] + [
            store.frame_from_arrow(tbl).with_columns(_m=pl.lit(k, pl.Int64)) for k, tbl in got["steps"].items()
        ]
        steps = pl.concat([p.select(steps.columns) for p in steps_parts], how="vertical_relaxed").sort(
            "_m", maintain_order=True
        )
    coll = [(k, tbl) for k, tbl in got["collectives"].items() if tbl.num_rows]
    coll_tbl = pa.concat_tables([tbl for _, tbl in coll]) if coll else _empty_stage("collectives")
    coll_owner = (
        np.concatenate([np.full(tbl.num_rows, k, np.int64) for k, tbl in coll]) if coll else np.zeros(0, np.int64)
    )
    return coll_tbl, coll_owner, steps.drop("_m").to_arrow(), steps["_m"].to_numpy()


# ------------------------------------------------------------------ the task
def file_span(events: Path) -> tuple[int | None, int | None]:
    """Earliest ts and latest ts + dur of a trace's events file, streaming row groups."""
    lo = hi = None
    for b in pq.ParquetFile(events).iter_batches(columns=["ts_ns", "dur_ns"], batch_size=1 << 18):
        ts = b.column(0)
        end = pc.add(ts, pc.fill_null(b.column(1), 0))
        mn, mx = pc.min(ts).as_py(), pc.max(end).as_py()
        lo = mn if lo is None or (mn is not None and mn < lo) else lo
        hi = mx if hi is None or (mx is not None and mx > hi) else hi
    return lo, hi


def _spans(t: Tables) -> dict[int, tuple]:
    """`file_span` of each member's events."""
    ev = t.tables["events"]
    frame = pl.DataFrame(
        {
            "m": t.owner["events"],
            "ts": store.series_from_arrow(ev.column("ts_ns")),
            "dur": store.series_from_arrow(ev.column("dur_ns")),
        }
    )
    per = frame.group_by("m").agg(lo=pl.col("ts").min(), hi=(pl.col("ts") + pl.col("dur").fill_null(0)).max())
    return {k: (lo, hi) for k, lo, hi in per.iter_rows()}


def _facts(m: Member, row: dict, truncated: bool, reason: str | None, span) -> dict:
    return {
        "status": "truncated" if truncated else "ok",
        "error": reason if truncated else None,
        "n_events": row["n_events"],
        "n_gpu_ops": row["n_gpu_ops"],
        "n_flows": row["n_flows"],
        "n_devices": row["n_devices"],
        "trace_start_ns": span[0],
        "trace_end_ns": span[1],
        "started_at": m.started,
        "finished_at": utc_now(),
        "warnings": "; ".join(m.warnings) or None,
    }


def _flatten_alone(m: Member, scratch: Path, workers: int, max_inflate: float | None):
    """Flatten a member by `flatten` into `scratch`: its facts (quarantined if it is no trace)."""
    from pipeline.flatten import flatten

    m.alone = True
    try:
        r = flatten(m.path, scratch / m.trace_id, workers=workers, max_inflate=max_inflate)
    except OutputError:
        raise  # a full disk: not the file's fault, retried by the next run
    except TracepipeError as e:
        m.facts = {
            "status": "quarantined",
            "error": quarantine_message(e, m.path, m.source),
            "started_at": m.started,
            "finished_at": utc_now(),
        }
        return
    m.flat = r.out_dir
    m.warnings = list(r.warnings)
    row = {"n_events": r.n_events, "n_gpu_ops": r.n_gpu_ops, "n_flows": r.n_flows, "n_devices": r.n_devices}
    m.facts = _facts(m, row, r.truncated, r.truncation_reason, file_span(r.out_dir / "events.parquet"))


@dataclass
class Grouped:
    """What `_group` made of the members it flattened together: their tables (in member order),
    the member of each row, and the members."""

    members: list[Member]
    tables: dict[str, pa.Table]
    owner: dict[str, np.ndarray]

    def rows_of(self, name: str, first: int, last: int) -> tuple[pa.Table, np.ndarray]:
        """The rows of members first..last (consecutive), and their member indexes."""
        owner = self.owner[name]
        lo, hi = np.searchsorted(owner, first, "left"), np.searchsorted(owner, last, "right")
        return self.tables[name].slice(lo, hi - lo), owner[lo:hi]


def _group(members: list[Member], work: Path, max_inflate: float | None) -> Grouped | None:
    """Read, decode, link and cost the small members together; those that cannot be end `alone`."""
    from pipeline.read.metadata import devices_table  # noqa: F401 - imported before the timing-critical part

    grouped: list[Member] = []
    parts: list[Tables] = []
    batch: list[Member] = []
    size = 0
    for m in [*members, None]:  # read and decode DECODE_BYTES of text at a time: texts are not held long
        if m is not None and read_text(m, max_inflate):
            batch.append(m)
            size += len(m.text or b"")
        elif m is not None:
            m.alone = True
        if batch and (m is None or size >= DECODE_BYTES):
            got, some = _decode_some(batch)
            grouped += got
            parts.append(some)
            batch, size = [], 0
    t = _concat(parts)
    if not grouped:
        return None
    _finish_read(grouped, t, {})
    fits = _fits(t)
    if not fits.all():  # ids beyond a band: those members go alone
        for k in np.flatnonzero(~fits):
            grouped[k].alone = True
        keep = np.flatnonzero(fits)
        remap = np.full(t.n, -1, np.int64)
        remap[keep] = np.arange(len(keep))
        tables, owner = {}, {}
        for name in _READ_TABLES:
            rows = np.flatnonzero(fits[t.owner[name]])
            tables[name], owner[name] = _select(t.tables[name], rows), remap[t.owner[name][rows]]
        grouped = [grouped[k] for k in keep]
        t = Tables(tables, owner, len(grouped))
        if not grouped:
            return None
    t.tables["gpu_ops"] = _link_all(grouped, t, work)
    coll, coll_owner, steps, steps_owner = _run_tables(grouped, t, work)
    spans = _spans(t)
    for i, m in enumerate(grouped):
        m.row[KEY] = m.trace_id
        m.row["source_path"] = m.source
        m.facts = _facts(m, m.row, False, None, spans.get(i, (None, None)))
    devices = [m.devices for m in grouped]
    tables = {
        **t.tables,
        "devices": pa.concat_tables(devices),
        "trace": pa.Table.from_pylist(
            [m.row for m in grouped], schema=schema.table("trace").arrow_schema(schema.ALL_STAGES)
        ),
        "collectives": coll,
        "steps": steps,
    }
    owner = {
        **t.owner,
        "devices": np.repeat(np.arange(len(grouped), dtype=np.int64), [d.num_rows for d in devices]),
        "trace": np.arange(len(grouped), dtype=np.int64),
        "collectives": coll_owner,
        "steps": steps_owner,
    }
    return Grouped(grouped, tables, owner)


def _write(members: list[Member], grouped: Grouped | None, stage: Path):
    """Write the part files (in trace_id order: runs of grouped members, then a member alone...)."""
    writer = PartWriter(stage)
    index = {id(m): k for k, m in enumerate(grouped.members)} if grouped else {}
    ids = pa.array([m.trace_id for m in grouped.members], pa.string()) if grouped else None
    run: list[int] = []  # consecutive grouped members not written yet

    def flush():
        if run and grouped is not None and ids is not None:
            for name in TABLES:
                tbl, owner = grouped.rows_of(name, run[0], run[-1])
                writer.add(name, tbl, ids.take(pa.array(owner, pa.int64())))
            run.clear()

    try:
        for m in members:
            if m.facts is None or m.facts["status"] == "quarantined":
                continue
            if id(m) in index:
                run.append(index[id(m)])
                continue
            flush()
            assert m.flat is not None
            for name in TABLES:
                f = pq.ParquetFile(m.flat / f"{name}.parquet")
                for batch in f.iter_batches(batch_size=PART_ROW_GROUP_ROWS):
                    tbl = pa.Table.from_batches([batch])
                    if name == "trace":
                        for col, value in ((KEY, m.trace_id), ("source_path", m.source)):
                            tbl = tbl.set_column(tbl.schema.get_field_index(col), col, _repeat(value, tbl.num_rows))
                    writer.add(name, tbl, _repeat(m.trace_id, tbl.num_rows))
            shutil.rmtree(m.flat, ignore_errors=True)
        flush()
        writer.close()
    except BaseException:
        writer.abandon()
        raise


def run_group(
    tasks: list[tuple[str, str, str]],
    stage: str,
    max_inflate: float | None = None,
    workers: int = 1,
    small: bool = True,
) -> list[dict]:
    """Flatten the inputs (path, source, trace_id) into STAGE/<table>.parquet (`PartWriter`);
    return each input's manifest facts, in the order given. `small`: read, link and cost them
    together (`_group`), else each alone with `workers` processes (a large trace).

    A file that is not a readable trace gets status `quarantined`; other exceptions propagate (a
    full disk: OutputError).
    """
    doomed = os.environ.get(FAULT_KILL)
    if doomed and any(doomed in source for _, source, _ in tasks):  # fault injection, for tests
        os.kill(os.getpid(), signal.SIGKILL)
    stage_dir = Path(stage)
    shutil.rmtree(stage_dir, ignore_errors=True)
    stage_dir.mkdir(parents=True)
    members = sorted((Member(p, s, t) for p, s, t in tasks), key=lambda m: m.trace_id)
    grouped = None
    try:
        if small and len(members) > 1:
            try:
                with _gc_paused():
                    grouped = _group(members, stage_dir / "work", max_inflate)
            except (OutputError, MemoryError):
                raise
            except Exception:  # a group that fails where flatten would not (a bug): each alone
                if os.environ.get("TRACEPIPE_GROUP_STRICT"):
                    raise
                grouped = None
                for m in members:
                    m.alone, m.facts = True, None
        for m in members:
            if m.facts is None:
                _flatten_alone(m, stage_dir / "alone", workers, max_inflate)
        with store.output_of(stage_dir):
            _write(members, grouped, stage_dir)
    finally:
        for d in ("work", "alone"):
            shutil.rmtree(stage_dir / d, ignore_errors=True)
    by_id = {m.trace_id: m.facts for m in members}
    return [by_id[t] or {} for _, _, t in tasks]


class _gc_paused:
    """Within: no cyclic garbage collection (a group's many small objects go by refcount)."""

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()
