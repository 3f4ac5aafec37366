"""cost: FLOPs and bytes per GPU kernel, achieved FLOP/s and bandwidth against the device's peak.

An op's cost comes from the formula table (`pipeline.formulas`), evaluated once per distinct
(op name, Input Dims, Input type, Input Strides, Concrete Inputs) signature, and is split over
the kernels that op launched in proportion to their durations (a split-K GEMM's kernels share
its FLOPs; nothing is counted once per kernel). memcpy/memset carry their own byte counts.
Kernels whose op has no formula keep null cost with a reason (`unmodelled_reason`).
"""
from __future__ import annotations

import math
from pathlib import Path

import orjson
import polars as pl

from . import devices as device_specs_mod
from . import formulas, link, schema, store
from .categories import with_category

SIGNATURE_KEYS = formulas.ARGS_READ
PEAK_COLS = device_specs_mod.PEAK_COLS
DTYPE_PEAK = device_specs_mod.DTYPE_PEAK


def op_costs(events: pl.LazyFrame, op_idx: pl.Series, dtype: str | None) -> pl.DataFrame:
    """(cpu_op_event_idx, op_flops, op_bytes, cost_family, cost_dtype, op_reason) for the given ops.

    The events are read with the streaming engine, only the given ops' rows decoded. Only ops
    whose name has a formula have their shape args extracted, and each distinct signature is
    evaluated once.
    """
    key = pl.col("name").str.split(" ").list.first()
    wanted = op_idx.unique().drop_nulls().implode()
    # a predicate rather than a semi-join: the Parquet reader filters each row group by event_idx
    # before it decodes the other columns (a streaming semi-join holds far more)
    ops = (events.select("event_idx", "name", "args_json")
           .filter(pl.col("event_idx").is_in(wanted))
           .with_columns(modelled=pl.col("name").is_in(formulas.MODELLED_OPS) | key.is_in(formulas.MODELLED_OPS))
           .select(pl.col("event_idx").alias("cpu_op_event_idx"), "modelled", pl.col("name").cast(pl.Categorical),
                   *_signature(pl.when("modelled").then(pl.col("args_json"))))
           .collect(engine="streaming"))
    modelled = ops.filter("modelled")
    keys = ["name", *SIGNATURE_KEYS]
    rows = [_evaluate(r, dtype) for r in modelled.select(keys).unique().iter_rows(named=True)]
    schema = {**{k: pl.String for k in keys}, "op_flops": pl.Float64, "op_bytes": pl.Float64,
              "cost_family": pl.String, "cost_dtype": pl.String, "op_reason": pl.String}
    costs = pl.DataFrame(rows, schema=schema).with_columns(pl.col(keys).cast(pl.Categorical))
    costed = modelled.join(costs, on=keys, how="left", nulls_equal=True)
    unmodelled = ops.filter(~pl.col("modelled")).select("cpu_op_event_idx", op_reason=pl.lit("no_formula"))
    return pl.concat([costed.select("cpu_op_event_idx", "op_flops", "op_bytes", "cost_family", "cost_dtype",
                                    "op_reason"), unmodelled], how="diagonal")


def _signature(args: pl.Expr) -> list[pl.Expr]:
    """SIGNATURE_KEYS of each op's args as polars' json_path_match gives them (categoricals: they
    repeat). Each lookup parses the whole JSON text, so a key is looked up only in the args that
    contain it as text (args_json is written by orjson: keys appear verbatim); the others are null,
    as json_path_match would give."""
    return [pl.when(args.str.contains(f'"{k}"', literal=True)).then(args).str.json_path_match(f"$['{k}']")
            .cast(pl.Categorical).alias(k) for k in SIGNATURE_KEYS]


def _json_value(text: str):
    """A value from polars' json_path_match, which gives string values without their quotes."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _evaluate(sig: dict, dtype: str | None) -> dict:
    args = {k: _json_value(sig[k]) for k in SIGNATURE_KEYS if sig[k] is not None}
    c = formulas.op_cost(sig["name"] or "", args, dtype_fallback=dtype)
    if c is None:
        return {**sig, "op_flops": None, "op_bytes": None, "cost_family": None, "cost_dtype": None,
                "op_reason": "no_shapes" if not args.get("Input Dims") else "shapes_not_modelled"}
    flops, nbytes = _finite(c.flops), _finite(c.bytes)  # unknown dtype sizes come back as NaN bytes
    return {**sig, "op_flops": flops, "op_bytes": nbytes, "cost_family": c.family,
            "cost_dtype": c.dtype, "op_reason": None if flops is not None else "shapes_not_modelled"}


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def resolve_devices(devs: pl.DataFrame) -> pl.DataFrame:
    """Give rows for ids absent from deviceProperties the model of the listed devices, if all are one."""
    listed = devs.filter(pl.col("source") == "deviceProperties")
    names = listed["name"].drop_nulls().unique()
    if names.len() != 1:
        return devs.with_columns(inferred=pl.lit(False))
    model = listed.filter(pl.col("name") == names[0]).row(0, named=True)
    fill = ["name", "total_global_mem", "compute_major", "compute_minor", "num_sms"]
    unlisted = pl.col("source") == "gpu_events"
    return devs.with_columns(
        [pl.when(unlisted).then(pl.lit(model[c])).otherwise(pl.col(c)).alias(c) for c in fill]
    ).with_columns(inferred=unlisted)


def annotate_devices(flat_dir: Path, extra_specs: str | None, force: str | None) -> tuple[pl.DataFrame, list]:
    devs = resolve_devices(pl.read_parquet(flat_dir / "devices.parquet"))
    specs = device_specs_mod.load_specs(extra_specs)
    out, warnings = device_specs_mod.annotate_devices(devs.drop("inferred"), specs, force=force)
    out = out.with_columns(
        spec_match=pl.when(devs["inferred"] & (pl.col("spec_match") != "unknown"))
        .then(pl.lit("inferred")).otherwise(pl.col("spec_match")))
    return out, warnings


def kernel_costs(g: pl.DataFrame, ops: pl.DataFrame, devs: pl.DataFrame) -> pl.DataFrame:
    """Add flops/bytes/achieved columns to linked gpu_ops (columns used: kind, name, device,
    dur_ns, copy_bytes, cpu_op_event_idx, cpu_op_name; the others are carried along).

    Eager on purpose: the in-memory engine divides by a column that holds one value throughout
    (the peaks of a one-device trace) by multiplying with its reciprocal, the streaming engine
    does not, and the last bits of the results must not depend on the engine.
    """
    is_kernel = pl.col("kind") == "kernel"
    dur_s = pl.col("dur_ns") / 1e9
    share = (pl.when(pl.col("op_dur_ns") > 0).then(pl.col("dur_ns") / pl.col("op_dur_ns"))
             .otherwise(1.0 / pl.col("op_kernels")))
    g = (g.join(ops, on="cpu_op_event_idx", how="left")
         .with_columns(
             op_kernels=pl.when(is_kernel & pl.col("cpu_op_event_idx").is_not_null())
             .then(pl.len().over("cpu_op_event_idx", "kind")),
             op_dur_ns=pl.when(is_kernel).then(pl.col("dur_ns").fill_null(0).sum().over("cpu_op_event_idx", "kind"))))
    g = with_category(g).with_columns(
        flops=pl.when(is_kernel).then(pl.col("op_flops") * share).otherwise(pl.lit(0.0)),
        bytes=pl.when(is_kernel).then(pl.col("op_bytes") * share)
        .otherwise(pl.col("copy_bytes").cast(pl.Float64)),
        cost_family=pl.when(is_kernel).then(pl.col("cost_family")).otherwise(pl.col("kind")),
        unmodelled_reason=pl.when(~is_kernel).then(None)
        .when(pl.col("cpu_op_event_idx").is_null()).then(pl.lit("no_cpu_op"))
        .otherwise(pl.col("op_reason")),
    )
    peaks = devs.select(pl.col("device"), "spec_name", *PEAK_COLS).unique("device", keep="first")
    g = g.join(peaks, on="device", how="left")
    dtype_peak = pl.coalesce(
        pl.when(pl.col("cost_dtype") == d).then(pl.col(col)) for d, col in DTYPE_PEAK.items()
    )
    g = g.with_columns(peak_tflops=pl.coalesce(dtype_peak, pl.col("peak_bf16_tflops")))
    g = g.with_columns(
        achieved_tflops=pl.when(pl.col("dur_ns") > 0).then(pl.col("flops") / dur_s / 1e12),
        achieved_gbps=pl.when(pl.col("dur_ns") > 0).then(pl.col("bytes") / dur_s / 1e9),
        arithmetic_intensity=pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes")),
    ).with_columns(
        achieved_flops_pct=100 * pl.col("achieved_tflops") / pl.col("peak_tflops"),
        achieved_bw_pct=100 * pl.col("achieved_gbps") / pl.col("peak_bw_gbps"),
        roofline_bound=pl.when(pl.col("arithmetic_intensity").is_null() | pl.col("peak_tflops").is_null()
                               | pl.col("peak_bw_gbps").is_null()).then(None)
        .when(pl.col("arithmetic_intensity") * pl.col("peak_bw_gbps") / 1e3 >= pl.col("peak_tflops"))
        .then(pl.lit("compute")).otherwise(pl.lit("memory")),
    )
    return g.drop("op_flops", "op_bytes", "op_reason", "op_dur_ns", *[c for c in PEAK_COLS if c != "peak_bw_gbps"])


def cost_counts(g: pl.DataFrame) -> dict:
    k = g.filter(pl.col("kind") == "kernel")
    total = k["dur_ns"].fill_null(0).sum()
    modelled = k.filter(pl.col("flops").is_not_null())["dur_ns"].fill_null(0).sum()
    reasons = k.filter(pl.col("flops").is_null())["unmodelled_reason"].value_counts()
    out = {f"unmodelled:{r['unmodelled_reason']}": r["count"] for r in reasons.iter_rows(named=True)}
    return {"n_kernels": k.height, "n_costed": k.filter(pl.col("flops").is_not_null()).height,
            "gpu_time_modelled_pct": 100.0 * modelled / total if total else None, "problems": out}


COST_INPUTS = ["event_idx", "kind", "name", "device", "dur_ns", "copy_bytes"]  # the gpu_ops columns kernel_costs reads


def _costs(gpu_ops: Path, links: pl.DataFrame, ops: pl.DataFrame, devs: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, cost columns) of every GPU op: `kernel_costs` of the columns it reads only, kernel
    names as categoricals (long strings repeated on every launch)."""
    g = (pl.scan_parquet(gpu_ops).select(COST_INPUTS).with_columns(pl.col("name").cast(pl.Categorical)).collect()
         .join(links.select("event_idx", "cpu_op_event_idx", "cpu_op_name"), on="event_idx", how="left"))
    costed = kernel_costs(g, ops, devs)
    return costed.select("event_idx", *[c for c in costed.columns if c not in g.columns])


def _write_gpu_ops(flat_dir: Path, added: pl.DataFrame):
    """Rewrite gpu_ops.parquet with the link and cost columns `added` (one row per GPU op, in file
    order), sorted by event_idx. Flatten writes GPU ops in that order, so the file is extended
    batch by batch; otherwise the whole table is joined and sorted in memory."""
    gpu_ops = flat_dir / "gpu_ops.parquet"
    with store.atomic_file(gpu_ops) as tmp:  # gpu_ops.parquet is read while the new one is written
        if added["event_idx"].is_sorted():
            store.write_extended(gpu_ops, added, tmp, "gpu_ops")
        else:
            g = pl.scan_parquet(gpu_ops).select(schema.table("gpu_ops").names(("flatten",))).collect()
            g = g.join(added, on="event_idx", how="left").sort("event_idx")
            store.write_table(g.to_arrow(), tmp, "gpu_ops")


def enrich(flat_dir, row: dict, device_specs: str | None = None, device: str | None = None,
           dtype: str | None = None) -> list[str]:
    """Link and cost a freshly flattened directory in place; update the trace row. Returns warnings.

    Linking and costing read only the GPU ops' columns they need (`link.gpu_links`, `_costs`); the
    wide table is then read, joined with their results and written back batch by batch, never
    whole in memory.
    """
    flat_dir = Path(flat_dir)
    links = link.gpu_links(flat_dir)
    link_problems = link.link_counts(links)
    devs, warnings = annotate_devices(flat_dir, device_specs, device)
    ops = op_costs(pl.scan_parquet(flat_dir / "events.parquet"), links["cpu_op_event_idx"], dtype)
    gpu_ops = flat_dir / "gpu_ops.parquet"
    costs = _costs(gpu_ops, links, ops, devs)
    _write_gpu_ops(flat_dir, pl.concat([links.drop("correlation"), costs.drop("event_idx")], how="horizontal"))
    store.write_table(devs.to_arrow(), flat_dir / "devices.parquet", "devices")
    counts = cost_counts(pl.scan_parquet(gpu_ops).select("kind", "dur_ns", "flops", "unmodelled_reason").collect())
    problems = orjson.loads(row["problems_json"])
    problems.update({k: v for k, v in {**link_problems, **counts.pop("problems")}.items() if v})
    row.update(counts)
    row["n_launch_linked"] = int(links["launch_event_idx"].is_not_null().sum())
    row["n_cpu_op_linked"] = int(links["cpu_op_event_idx"].is_not_null().sum())
    row["problems_json"] = orjson.dumps(problems).decode()
    return warnings
