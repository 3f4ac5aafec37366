"""link: the GPU ops of a group linked and costed as `enrich` does each trace's (`link_all`): one
pass over the group's banded tables per set of members that agree on the per-trace link facts,
kernels costed against their own trace's devices, the counts tallied per member."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import schema, store
from pipeline.dataset.group.bands import banded
from pipeline.dataset.group.decode import READ_TABLES, Tables, select
from pipeline.dataset.members import Member

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


def _link_and_cost(t: Tables, part: np.ndarray, work: Path, matched: list, formulas=None) -> pl.DataFrame:
    """The link and cost columns (`links.LINK_COLUMNS`, `enrich.COST_COLUMNS`) of the GPU ops of the
    members `part` (which agree on the per-trace link facts), as `enrich` gives them: one pass
    over their tables. Rows in the group's gpu_ops order with `_row` (their row there), `_m`,
    and the columns the counts read (kind, dur_ns, correlation)."""
    from pipeline.cost.enrich import (
        CAUSE_LINKS,
        COST_COLUMNS,
        KERNEL_INPUTS,
        OP_COST_COLUMNS,
        OP_INSTANCE,
        kernel_costs,
        link_pass,
    )
    from pipeline.link import links as link

    whole = len(part) == t.n
    in_part = np.zeros(t.n, dtype=bool)
    in_part[part] = True
    rows = {n: np.flatnonzero(in_part[t.owner[n]]) for n in READ_TABLES}
    n_events = np.bincount(t.owner["events"], minlength=t.n) * in_part
    offsets = np.concatenate([[0], np.cumsum(n_events)[:-1]])
    work.mkdir(parents=True, exist_ok=True)
    with store.scratch_files():  # read once, by the link pass below
        for name in READ_TABLES:
            tbl = t.tables[name] if whole else select(t.tables[name], rows[name])
            owner = t.owner[name][rows[name]]
            store.write_table(banded(tbl, name, owner, offsets), work / f"{name}.parquet", name, ("flatten",))
    spill = work / "links.arrow"
    op_kernels = link_pass(work, spill, None, user=formulas)  # as `enrich` spills its pass 1 (read back whole)
    with store.SpillReader(spill) as reader:
        spilled = reader.take(1 << 62)
    gpu_rows = rows["gpu_ops"]
    if spilled.height != len(gpu_rows):
        raise RuntimeError(f"linking gave {spilled.height} rows for {len(gpu_rows)} GPU ops")
    owner = t.owner["gpu_ops"][gpu_rows]
    gpu = t.tables["gpu_ops"]
    correlation = store.series_from_arrow((gpu if whole else select(gpu, gpu_rows)).column("correlation"))
    spilled = spilled.with_columns(
        _row=pl.Series(gpu_rows, dtype=pl.Int64),
        _m=pl.Series(owner, dtype=pl.Int64),
        _offset=pl.Series(offsets[owner], dtype=pl.Int64),
        correlation=correlation,
    )
    shaped = spilled.filter(pl.col("op_shapes")).get_column("_m").unique().implode()  # members that recorded shapes
    linked = spilled.filter(pl.col("launch_event_idx").is_not_null()).get_column("_m").unique().implode()
    by_devices: dict[int, list[int]] = {}  # members with the same devices are costed together
    for k in part:
        by_devices.setdefault(id(matched[k][0]), []).append(int(k))
    pieces = []
    for ks in by_devices.values():
        chunk = spilled.filter(pl.col("_m").is_in(ks)) if len(by_devices) > 1 else spilled
        recorded = pl.col("_m").is_in(shaped).alias("trace_shapes")  # per trace, as `enrich` tells
        launched = pl.col("_m").is_in(linked).alias("trace_launches")
        g = chunk.select(*KERNEL_INPUTS, *CAUSE_LINKS, OP_INSTANCE, *OP_COST_COLUMNS, recorded, launched)
        costed = kernel_costs(g, op_kernels.of(g[OP_INSTANCE]), matched[ks[0]][0])
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
        **Tally.cost_counts(),  # n_kernels, n_costed, kernel_ns, modelled_ns
    )
    assert len(keys) == 7
    for r in counts.iter_rows():
        t = out[r[0]]
        t.links.update(dict(zip(keys, r[1:8])))
        t.n_launch_linked, t.n_cpu_op_linked, t.n_kernels, t.n_costed, t.kernel_ns, t.modelled_ns = map(int, r[8:])
    reasons = linked.filter(Tally.UNMODELLED).group_by("_m", "unmodelled_reason").len()
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


def link_all(members: list[Member], t: Tables, work: Path, formulas=None) -> pa.Table:
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
        [_link_and_cost(t, np.array(ks), work / f"link-{i}", matched, formulas) for i, ks in enumerate(parts.values())]
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
