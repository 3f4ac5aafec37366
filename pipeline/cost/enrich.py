"""cost: FLOPs and bytes per GPU kernel, achieved FLOP/s and bandwidth against the device's peak.

An op's cost comes, in this order, from the user's formula file (`--formulas`, `formulas.user`),
the formula table (`pipeline.cost.formulas`), each evaluated once per distinct (op name, Input
Dims, Input type, Input Strides, Concrete Inputs) signature, or Inductor's own estimate on the
record of a Triton launch (`kernel_flop`, `kernel_num_gb`). An op's FLOPs are split over the
kernels that do its math (`kernel_role` = math: `pipeline.cost.kernel_roles`) in proportion to
their durations, never given to the layout conversions, copies, fills, split-K reductions or
epilogues around them; its bytes go to its math kernels too, or to all its kernels when it
launched no math kernel (a copy op's copy kernels are its work). Nothing is counted once per
kernel. memcpy/memset carry their own byte counts. Each kernel is held to the peak of the
precision its math ran at (`math_mode`: from its name, `pipeline.cost.math_modes`, else its op's
dtype; `pipeline.cost.peaks`), and a kernel that moved its bytes faster than DRAM can is
`roofline_bound` = cache. Each costed kernel says where its cost came from (`cost_source`),
every other one why it has none (`unmodelled_reason`, the causes of `pipeline.cost.coverage`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import orjson
import polars as pl
import pyarrow as pa

from pipeline import native, schema, store
from pipeline.cost import coverage, formulas, peaks, roofline
from pipeline.cost import devices as device_specs_mod
from pipeline.cost.categories import with_category, with_library_task
from pipeline.cost.formulas.expression import FormulaError
from pipeline.cost.formulas.user import UserFormulas
from pipeline.cost.kernel_roles import FLOP_ROLES, with_kernel_role
from pipeline.cost.math_modes import NAMED, with_named_mode
from pipeline.cost.memo import Memo
from pipeline.kineto import ARG_ALIASES, COMPILED_REGION, canonical_args
from pipeline.link import graph_ids as graph_id_args
from pipeline.link import graphs
from pipeline.link import links as link
from pipeline.link.captures import CapturedGraphs
from pipeline.link.graph_ids import GraphIds

SIGNATURE_KEYS = formulas.ARGS_READ
try:
    from tracepipe_native import shape_keys as _native_shape_keys
except ImportError:  # not built, or a build before it had `shape_keys` (0.3.0): the regexes
    _native_shape_keys = None
OP_INSTANCE = graphs.OP_INSTANCE
PEAK_COLS = peaks.PEAK_COLS


class Evaluated(dict):
    """The costs of the op signatures evaluated so far (batches of one trace share most), and the
    first error of each formula-file entry that failed on an op (`errors`: label -> message)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: dict[str, str] = {}


# Inductor's launch record of a Triton kernel (`CachingAutotuner.run`) names its backend; with
# TORCHINDUCTOR_BENCHMARK_KERNEL=1 it also carries the kernel's estimated FLOPs and GB
_INDUCTOR_LAUNCH = '"kernel_backend"'
_ESTIMATES = ('"kernel_flop"', '"kernel_num_gb"')
# an op recorded shapes: Input Dims, as older layouts spell it too (the 2021 one: Input dims)
_SHAPES = tuple(f'"{k}"' for k in ("Input Dims", *(a for a, key in ARG_ALIASES.items() if key == "Input Dims")))


def _modelled(user: UserFormulas | None) -> pl.Expr:
    """Whether an op (`name`) has a formula: built-in, or in the user's file."""
    name, key = pl.col("name"), pl.col("name").str.split(" ").list.first()
    names = [*formulas.MODELLED_OPS, *(user.names if user else ())]
    modelled = name.is_in(names) | key.is_in(names)
    if user is not None and user.pattern_regex is not None:
        modelled = modelled | name.str.contains(user.pattern_regex)
    return modelled


def _estimate(key: str, scale: float = 1.0) -> pl.Expr:
    """An Inductor estimate from the args of a launch record that has one (`estimate_args`; null
    elsewhere, and unless a finite number at least 0)."""
    v = pl.col("estimate_args").str.json_path_match(f"$.{key}").cast(pl.Float64, strict=False) * scale
    return pl.when(v.is_finite() & (v >= 0)).then(v)


def op_costs(
    events: pl.LazyFrame,
    op_idx: pl.Series,
    dtype: str | None,
    evaluated: Evaluated | None = None,
    user: UserFormulas | None = None,
) -> pl.DataFrame:
    """(cpu_op_event_idx, *OP_COST_COLUMNS) for the given ops: FLOPs, bytes, family, dtype, where
    the cost came from (`op_source`), why there is none (`op_reason`, one of coverage.OP_REASONS)
    and whether the op recorded shapes (`op_shapes`).

    The events are read with the streaming engine, only the given ops' rows decoded. Only ops
    with a formula (or an Inductor launch record) have their shape args extracted, once per
    distinct `_shape` of their args (a trace's ops repeat a few hundred shapes), and each distinct
    signature is evaluated once (`evaluated` keeps the results across calls: batches of one trace
    share most signatures). Inductor's estimates are read in polars, op by op.
    """
    evaluated = Evaluated() if evaluated is None else evaluated
    wanted = op_idx.unique().drop_nulls()
    in_range = pl.col("event_idx").is_between(wanted.min(), wanted.max()) if wanted.len() else pl.lit(False)
    args = pl.col("args_json")
    inductor = args.str.contains(_INDUCTOR_LAUNCH, literal=True)
    estimated = inductor & pl.any_horizontal(args.str.contains(k, literal=True) for k in _ESTIMATES)
    # a predicate rather than a semi-join: the Parquet reader filters each row group by event_idx
    # (skipping those outside the range) before it decodes the other columns
    ops = (
        events.select("event_idx", "name", "args_json")
        .filter(in_range & pl.col("event_idx").is_in(wanted.implode()))
        .with_columns(modelled=_modelled(user), inductor=inductor)
        .select(
            pl.col("event_idx").alias("cpu_op_event_idx"),
            "modelled",
            "inductor",
            compiled=pl.col("name").str.contains(COMPILED_REGION),
            op_shapes=pl.any_horizontal(args.str.contains(k, literal=True) for k in _SHAPES),
            estimate_args=pl.when(estimated).then(args),
            name=pl.col("name").cast(pl.Categorical),
            args=pl.when(pl.col("modelled") | pl.col("inductor")).then(args),
        )
        .collect(engine="streaming")
    )  # JSON is parsed below only where it is needed: the args of ops with formulas or estimates
    ops = ops.with_columns(est_flops=_estimate("kernel_flop"), est_bytes=_estimate("kernel_num_gb", 1e9))
    evaluate = ops.filter(pl.col("modelled") | pl.col("inductor"))
    evaluate = evaluate.with_columns(shape=shape_keys(evaluate["args"]))
    shapes = evaluate.group_by("name", "shape").agg(pl.col("args").first())
    costed = evaluate.join(
        _shape_costs(shapes, dtype, evaluated, user), on=["name", "shape"], how="left", nulls_equal=True
    )
    use = pl.col("op_source").is_null() & (pl.col("est_flops").is_not_null() | pl.col("est_bytes").is_not_null())
    costed = costed.with_columns(
        op_flops=pl.when(use).then("est_flops").otherwise("op_flops"),
        op_bytes=pl.when(use).then("est_bytes").otherwise("op_bytes"),
        cost_family=pl.when(use).then(pl.lit("inductor")).otherwise("cost_family"),
        op_source=pl.when(use).then(pl.lit("inductor")).otherwise("op_source"),
        op_reason=pl.when(use)
        .then(None)
        .when(pl.col("inductor") & (pl.col("op_reason") == "no_formula"))
        .then(pl.lit("inductor_no_estimate"))
        .otherwise("op_reason"),
    ).with_columns(cost_dtype=pl.when(pl.col("op_source").is_not_null()).then("cost_dtype"))  # of costed ops only
    unmodelled = ops.filter(~pl.col("modelled") & ~pl.col("inductor")).select(
        "cpu_op_event_idx",
        "op_shapes",
        op_reason=pl.when("compiled").then(pl.lit("compiled_region")).otherwise(pl.lit("no_formula")),
    )
    return pl.concat([costed.select("cpu_op_event_idx", *OP_COST_COLUMNS), unmodelled], how="diagonal")


def _shape_costs(
    shapes: pl.DataFrame, dtype: str | None, evaluated: Evaluated, user: UserFormulas | None
) -> pl.DataFrame:
    """(name, shape, op_flops, op_bytes, cost_family, cost_dtype, op_reason, op_source) of ops
    (name, shape, args: the args of one op of that shape)."""
    keys = ["name", *SIGNATURE_KEYS]
    rows = []
    for sig in shapes.select("name", "shape", *_signature(pl.col("args"))).iter_rows(named=True):
        shape = sig.pop("shape")
        known = tuple(sig.values())
        if known not in evaluated:
            evaluated[known] = _evaluate(sig, dtype, user, evaluated.errors)
        rows.append({"shape": shape, **evaluated[known]})
    schema = {
        "shape": pl.String,
        **{k: pl.String for k in keys},
        "op_flops": pl.Float64,
        "op_bytes": pl.Float64,
        "cost_family": pl.String,
        "cost_dtype": pl.String,
        "op_reason": pl.String,
        "op_source": pl.String,
    }
    return pl.DataFrame(rows, schema=schema).select(
        pl.col("name").cast(pl.Categorical), "shape", *[c for c in schema if c.startswith(("op_", "cost_"))]
    )


def _signature(args: pl.Expr) -> list[pl.Expr]:
    """SIGNATURE_KEYS of each op's args as polars' json_path_match gives them. Each lookup parses
    the whole JSON text, so a key is looked up only in the args that contain it as text (keys
    appear verbatim); the others are null, as json_path_match would give."""
    return [
        pl.when(args.str.contains(f'"{k}"', literal=True)).then(args).str.json_path_match(f"$['{k}']").alias(k)
        for k in SIGNATURE_KEYS
    ]


_JSON_SCALAR = r"(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null)\b"
_SCALAR_MEMBER = rf'"[^"\\]*":\s*{_JSON_SCALAR}'  # "key": 12 (a JSON string cannot hold an unescaped quote)
assert all(k.replace(" ", "").isalnum() for k in SIGNATURE_KEYS)  # usable as they are in a regex
_SCALAR_SIGNATURE = rf'"({"|".join(SIGNATURE_KEYS)})":\s*({_JSON_SCALAR})'  # "Group size": 8


def _shape(args: pl.Expr) -> pl.Expr:
    """A key that ops with the same signature share (and ops with different ones never do): their
    args without the members whose values are scalars (the ids that make every op's args unique:
    External id, Ev Idx, Sequence number, Record function id, ...) but for signature members. A
    scalar signature member (a collective's `"Group size": 8`) is first written `"Group size"=8`,
    which the removal passes over (outside a string, JSON text holds no `=`), and stays where it
    was. Only whole members that are not signature members are removed, so args with equal keys
    have equal signature members. (Args with a scalar signature member were once their own key:
    every `record_param_comms` of a trace was then costed apart, 3.9 s of a 1 GB NCCL trace's
    link.)"""
    return args.str.replace_all(_SCALAR_SIGNATURE, '"${1}"=${2}').str.replace_all(_SCALAR_MEMBER, "")


def shape_keys(args: pl.Series) -> pl.Series:
    """`_shape` of each op's args: in one pass of the compiled module where it is built (the two
    regex replacements took ~0.4 µs an op, 0.1 s a 30K-op batch of a 1 GB trace of 667K GPU
    ops; native/shape_keys.cpp states how it reads the same rule), else by the regexes."""
    if _native_shape_keys is None or not native.allowed() or args.dtype != pl.String:
        return args.to_frame().select(_shape(pl.col(args.name))).to_series().alias("shape")
    text = args.to_arrow(compat_level=pl.CompatLevel.oldest())  # large strings: int64 offsets
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    _, offsets, data = text.buffers()
    out_offsets, out_data = _native_shape_keys(offsets, data or b"", text.offset, len(text), SIGNATURE_KEYS)
    made = pa.LargeStringArray.from_buffers(len(text), pa.py_buffer(out_offsets), pa.py_buffer(out_data))
    shape = pl.Series("shape", made, dtype=pl.String)
    return shape if not args.null_count() else pl.select(pl.when(args.is_not_null()).then(shape)).to_series()


def _json_value(text: str):
    """A value from polars' json_path_match, which gives string values without their quotes."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _evaluate(sig: dict, dtype: str | None, user: UserFormulas | None, errors: dict) -> dict:
    """The cost of one op signature: by the user's entry for its name, else the built-in formula;
    else no cost, with the reason (coverage.OP_REASONS) and the dtype of its inputs."""
    args = canonical_args({k: _json_value(sig[k]) for k in SIGNATURE_KEYS if sig[k] is not None})
    name = sig["name"] or ""
    none = {"op_flops": None, "op_bytes": None, "cost_family": None, "cost_dtype": None, "op_source": None}
    entry = user.find(name) if user is not None else None
    if entry is not None:
        try:
            by_user = entry.cost(formulas.OpInputs.from_args(args, dtype))
        except (FormulaError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as e:
            errors.setdefault(entry.label, str(e))
            return {**sig, **none, "op_reason": "user_formula_error"}
        return {**sig, **_cost_row(by_user), "op_source": "user_formula"}
    if not formulas.has_formula(name):
        inputs_dtype = formulas.OpInputs.from_args(args, dtype).compute_dtype()
        return {**sig, **none, "cost_dtype": inputs_dtype, "op_reason": "no_formula"}
    c = formulas.op_cost(name, args, dtype_fallback=dtype)
    if c is None:
        return {**sig, **none, "op_reason": "no_shapes" if not args.get("Input Dims") else "shapes_not_modelled"}
    row = _cost_row(c)
    if row["op_flops"] is None:
        return {**sig, **none, "op_reason": "shapes_not_modelled"}
    return {**sig, **row, "op_source": "formula"}


def _cost_row(c: formulas.Cost) -> dict:
    """A Cost as op cost columns (unknown dtype sizes come back as NaN bytes: null)."""
    return {
        "op_flops": _finite(c.flops),
        "op_bytes": _finite(c.bytes),
        "cost_family": c.family,
        "cost_dtype": c.dtype,
        "op_reason": None,
    }


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def resolve_devices(devs: pl.DataFrame) -> pl.DataFrame:
    """Give rows for ids absent from deviceProperties the model of the listed devices, if all are one."""
    model = device_specs_mod.one_model(devs)
    if model is None:
        return devs.with_columns(inferred=pl.lit(False))
    fill = ["name", "total_global_mem", "compute_major", "compute_minor", "num_sms"]
    unlisted = pl.col("source") == "gpu_events"
    return devs.with_columns(
        [pl.when(unlisted).then(pl.lit(model[c])).otherwise(pl.col(c)).alias(c) for c in fill]
    ).with_columns(inferred=unlisted)


def matched_devices(flat_dir: Path, extra_specs: str | None, force: str | None) -> tuple[pl.DataFrame, list]:
    """The trace's devices (unlisted ids resolved) with the spec each matches, and warnings."""
    devs = resolve_devices(pl.read_parquet(flat_dir / "devices.parquet"))
    specs = device_specs_mod.load_specs(extra_specs)
    out, warnings = device_specs_mod.match_specs(devs.drop("inferred"), specs, force=force)
    out = out.with_columns(
        spec_match=pl.when(devs["inferred"] & (pl.col("spec_match") != "unknown"))
        .then(pl.lit("inferred"))
        .otherwise(pl.col("spec_match"))
    )
    return out, warnings


# of `op_costs`, per op: its cost, where it came from, why there is none, whether it recorded shapes
OP_COST_COLUMNS = ["op_flops", "op_bytes", "cost_family", "cost_dtype", "op_reason", "op_source", "op_shapes"]
OP_COST_TYPES = {"op_flops": pa.float64(), "op_bytes": pa.float64(), "op_shapes": pa.bool_()}  # others: string
# what `kernel_costs` reads besides KERNEL_INPUTS and OP_COST_COLUMNS: the link columns the causes read
CAUSE_LINKS = ["launch_event_idx", "launch_name", "cpu_op_event_idx"]


def kernel_costs(g: pl.DataFrame, op_kernels: pl.DataFrame, devs: pl.DataFrame) -> pl.DataFrame:
    """Add flops/bytes/achieved columns, `math_mode`, `cost_source` and `unmodelled_reason` to
    linked gpu_ops (columns used: KERNEL_INPUTS, CAUSE_LINKS, op_instance (whose FLOPs the kernel
    shares: its op, or for a graph-replayed kernel its (replay, captured op): `graphs.OP_INSTANCE`),
    their op's OP_COST_COLUMNS from `op_costs`, and `trace_shapes` / `trace_launches`: whether the
    trace recorded shapes / any launch at all; the others, such as `category`, are carried along).

    `op_kernels` is the count and time of each op's kernels, and of its math kernels, over the
    whole trace (`OpKernels`): `g` may be one batch of the GPU ops, and an op's FLOPs go to all
    its math kernels (by duration), its bytes to them too, or to all its kernels when it has no
    math kernel.

    Eager on purpose: the in-memory engine divides by a column that holds one value throughout
    (the peaks of a one-device trace) by multiplying with its reciprocal, the streaming engine
    does not, and the last bits of the results must not depend on the engine.
    """
    is_kernel = pl.col("kind") == "kernel"
    is_math = pl.col("kernel_role").is_in(list(FLOP_ROLES)).fill_null(False)
    dur_s = pl.col("dur_ns") / 1e9

    def share(dur: str, n: str) -> pl.Expr:  # of a kernel among kernels taking `dur` ns, `n` of them
        return pl.when(pl.col(dur) > 0).then(pl.col("dur_ns") / pl.col(dur)).otherwise(1.0 / pl.col(n))

    has_math = pl.col("math_kernels").fill_null(0) > 0
    flop_share = pl.when(is_math).then(share("math_dur_ns", "math_kernels")).otherwise(0.0)
    byte_share = pl.when(~has_math).then(share("op_dur_ns", "op_kernels")).when(is_math).then(flop_share)
    g = g.join(op_kernels, on=OP_INSTANCE, how="left", maintain_order="left").with_columns(
        pl.when(is_kernel).then(pl.col(c)).alias(c) for c in OpKernels.COUNTS
    )
    g = g.with_columns(
        flops=pl.when(is_kernel).then(pl.col("op_flops") * flop_share).otherwise(pl.lit(0.0)),
        bytes=pl.when(is_kernel).then(pl.col("op_bytes") * byte_share).otherwise(pl.col("copy_bytes").cast(pl.Float64)),
        cost_family=pl.when(is_kernel).then(pl.col("cost_family")).otherwise(pl.col("kind")),
        cost_source=pl.when(is_kernel).then(pl.col("op_source")).otherwise(pl.lit("transfer")),
    ).with_columns(
        # the precision of its math: its name's, else (when it has FLOPs) its op's dtype's; none for
        # a kernel doing none of its op's math
        math_mode=pl.when(is_kernel & is_math).then(
            pl.coalesce(NAMED, pl.when(pl.col("flops") > 0).then(peaks.dtype_mode(pl.col("cost_dtype"))))
        ),
        unmodelled_reason=coverage.unmodelled_reason(pl.col("cost_source").is_not_null()),
    )
    peak_cols = devs.select(pl.col("device"), "spec_name", *PEAK_COLS).unique("device", keep="first")
    g = g.join(peak_cols, on="device", how="left", maintain_order="left")
    achieved_tflops = pl.when(pl.col("dur_ns") > 0).then(pl.col("flops") / dur_s / 1e12)
    # a mode read off the op's dtype that the kernel outran was not its mode (FP32 data above the
    # FP32 peak ran on TF32 tensor cores): `peaks.FASTER_MODE`
    for slow, fast in peaks.FASTER_MODE.items():
        outran = (
            pl.col(NAMED).is_null() & (pl.col("math_mode") == slow) & (achieved_tflops > peaks.mode_peak(pl.lit(slow)))
        )
        g = g.with_columns(math_mode=pl.when(outran.fill_null(False)).then(pl.lit(fast)).otherwise("math_mode"))
    g = g.with_columns(peak_tflops=peaks.mode_peak(pl.col("math_mode")))
    g = g.with_columns(
        achieved_tflops=achieved_tflops,
        achieved_gbps=pl.when(pl.col("dur_ns") > 0).then(pl.col("bytes") / dur_s / 1e9),
        arithmetic_intensity=roofline.intensity(pl.col("flops"), pl.col("bytes")),
    ).with_columns(
        achieved_flops_pct=100 * pl.col("achieved_tflops") / pl.col("peak_tflops"),
        achieved_bw_pct=100 * pl.col("achieved_gbps") / pl.col("peak_bw_gbps"),
        roofline_bound=roofline.bound(
            pl.col("arithmetic_intensity"), pl.col("peak_tflops"), pl.col("peak_bw_gbps"), pl.col("achieved_gbps")
        ),
    )
    dropped = [*OP_COST_COLUMNS, *OpKernels.COUNTS[1:], NAMED, "trace_shapes", "trace_launches"]
    kept = ("cost_family", "cost_dtype", "peak_bw_gbps")
    return g.drop(*[c for c in [*dropped, *PEAK_COLS] if c not in kept], strict=False)


class OpKernels:
    """Per CPU op, the count and total duration of the kernels it launched (`op_kernels`,
    `op_dur_ns`) and of those that do its math (`math_kernels`, `math_dur_ns`: `kernel_roles`)
    over the whole trace. Gathered batch by batch as one small table per batch, sorted by op, and
    summed over the batches only for the ops a batch of pass 2 asks for: building one table for
    the whole trace held several times its size at once, the largest thing that grew with the
    trace."""

    COUNTS = ("op_kernels", "op_dur_ns", "math_kernels", "math_dur_ns")
    _EMPTY = {
        OP_INSTANCE: pl.Int64,
        "op_kernels": pl.UInt32,
        "op_dur_ns": pl.Int64,
        "math_kernels": pl.UInt32,
        "math_dur_ns": pl.Int64,
    }

    def __init__(self) -> None:
        self._parts: list[pl.DataFrame] = []
        self.shapes_recorded = False  # whether any op the kernels link to recorded Input Dims
        self.launches_recorded = False  # whether any GPU op links to its launch

    def add(self, links: pl.DataFrame):
        """Count a batch of linked GPU ops (kind, dur_ns, kernel_role, op_instance)."""
        dur = pl.col("dur_ns").fill_null(0)
        is_math = pl.col("kernel_role").is_in(list(FLOP_ROLES)).fill_null(False)
        part = (  # lazy: only the four columns are filtered, not the batch's ~40
            links.lazy()
            .filter((pl.col("kind") == "kernel") & pl.col(OP_INSTANCE).is_not_null())
            .group_by(OP_INSTANCE)
            .agg(
                op_kernels=pl.len(),
                op_dur_ns=dur.sum(),
                math_kernels=is_math.sum().cast(pl.UInt32),
                math_dur_ns=dur.filter(is_math).sum(),
            )
            .sort(OP_INSTANCE)
            .collect()
        )
        if part.height:
            self._parts.append(part.cast(self._EMPTY))  # type: ignore[arg-type]

    def merge(self, other: OpKernels):
        """Add the counts of another part of the trace's GPU ops (`link_pass`)."""
        self._parts += other._parts
        self.shapes_recorded |= other.shapes_recorded
        self.launches_recorded |= other.launches_recorded

    def of(self, ops: pl.Series) -> pl.DataFrame:
        """(op_instance, COUNTS) of the ops from the first to the last of `ops` (a batch's ops are
        a narrow range: each batch's table is sliced by binary search; graph replays' instances,
        negative, are a range of their own)."""
        ops = ops.drop_nulls()
        pieces = [pl.DataFrame(schema=self._EMPTY)]
        for some in (ops.filter(ops < 0), ops.filter(ops >= 0)):
            if some.is_empty():
                continue
            first, last = some.min(), some.max()
            assert isinstance(first, int) and isinstance(last, int)  # int64 keys, nulls dropped
            for part in self._parts:
                idx = part[OP_INSTANCE]  # sorted: its first and last say whether to search it
                if idx[-1] < first or idx[0] > last:  # most parts: another stretch of the trace's ops
                    continue
                start, end = idx.search_sorted(first, side="left"), idx.search_sorted(last, side="right")
                if end > start:
                    pieces.append(part.slice(start, end - start))
        return pl.concat(pieces).group_by(OP_INSTANCE).agg(pl.col(c).sum() for c in self.COUNTS)


class Tally:
    """Counts summed over batches: link counts (`link.link_counts`), linked ops, and what the cost
    model covered (kernels, costed kernels, kernel time modelled, why the rest is not, the first
    error of each formula-file entry that failed)."""

    def __init__(self) -> None:
        self.links: Counter = Counter()
        self.n_launch_linked = self.n_cpu_op_linked = 0
        self.n_kernels = self.n_costed = self.kernel_ns = self.modelled_ns = 0
        self.unmodelled: Counter = Counter()
        self.formula_errors: dict[str, str] = {}  # formula-file entry -> its first error

    def add_links(self, links: pl.DataFrame):
        self.links.update(link.link_counts(links))
        self.n_launch_linked += int(links["launch_event_idx"].is_not_null().sum())
        self.n_cpu_op_linked += int(links["cpu_op_event_idx"].is_not_null().sum())

    def merge(self, other: Tally):
        """Add the counts of another part of the trace's GPU ops (`link_pass`)."""
        self.links.update(other.links)
        self.n_launch_linked += other.n_launch_linked
        self.n_cpu_op_linked += other.n_cpu_op_linked
        self.n_kernels += other.n_kernels
        self.n_costed += other.n_costed
        self.kernel_ns += other.kernel_ns
        self.modelled_ns += other.modelled_ns
        self.unmodelled.update(other.unmodelled)
        for where, why in other.formula_errors.items():
            self.formula_errors.setdefault(where, why)

    @staticmethod
    def cost_counts() -> dict[str, pl.Expr]:
        """The cost counts of linked and costed GPU ops, by the attribute they add to: a costed
        block's (`add_costs`), or each member's of a batch group (`dataset.group.link`)."""
        kernel, costed = pl.col("kind") == "kernel", pl.col("cost_source").is_not_null()
        ns = pl.col("dur_ns").fill_null(0)  # int64 ns
        return {
            "n_kernels": kernel.sum(),
            "n_costed": (kernel & costed).sum(),
            "kernel_ns": ns.filter(kernel).sum(),
            "modelled_ns": ns.filter(kernel & costed).sum(),
        }

    UNMODELLED = (pl.col("kind") == "kernel") & pl.col("cost_source").is_null()  # the kernels not costed

    def add_costs(self, g: pl.DataFrame):
        """Count a costed block's kernels. The counts are summed in one query over the four
        columns they need: filtering the block's ~40 columns for its kernels, then again for the
        costed and the other ones, copied them three times (0.22 CPU-s of a 1 GB trace's 667K
        GPU ops, 0.02 now)."""
        for name, n in g.select(**self.cost_counts()).row(0, named=True).items():
            setattr(self, name, getattr(self, name) + n)
        unmodelled = g.select(pl.col("unmodelled_reason").filter(self.UNMODELLED)).to_series()
        for reason, n in unmodelled.value_counts().iter_rows():
            self.unmodelled[f"unmodelled:{reason}"] += n

    def row_update(self, row: dict):
        """Write the counts into the trace row (and its problems_json)."""
        problems = orjson.loads(row["problems_json"])
        unmodelled = sorted(self.unmodelled.items(), key=lambda kv: (-kv[1], kv[0]))
        problems.update({k: v for k, v in [*self.links.items(), *unmodelled] if v})
        row.update(
            n_kernels=self.n_kernels,
            n_costed=self.n_costed,
            gpu_time_modelled_pct=100.0 * self.modelled_ns / self.kernel_ns if self.kernel_ns else None,
            n_launch_linked=self.n_launch_linked,
            n_cpu_op_linked=self.n_cpu_op_linked,
            problems_json=orjson.dumps(problems).decode(),
        )


COST_INPUTS = ["event_idx", "kind", "name", "device", "dur_ns", "copy_bytes"]  # the gpu_ops columns costing reads
# of them (and their category, role and the math mode their name gives), what kernel_costs reads
KERNEL_INPUTS = ["kind", "device", "dur_ns", "copy_bytes", "category", "kernel_role", NAMED, "library_task"]
COST_COLUMNS = schema.table("gpu_ops").names(("cost",))  # the columns it adds
LINKED = schema.table("gpu_ops").names(("link",))  # the columns linking adds (graphs' included)
# threads linking parts of the GPU ops side by side (`link_pass`). One, reading each batch's launches
# and slices ahead while the one before is nested and costed, took ~0.35 CPU-s (6%) less than two
# parts on a 1 GB trace (4.68M events, 333K GPU ops; link and cost 5.5 CPU-s), at about the same
# wall time on two cores and no more memory: each part decodes the row groups at its edges again,
# and two threads of small polars queries spend much of their time waiting on each other
LINK_PARTS = 1
LINK_SPILL = "gpu_links"  # the temporary file of pass 1 (see `enrich`)
GRAPH_SPILL = "graph_pairs"  # graph-replayed kernels paired with captured nodes (`graphs.GraphLinks`)
# GPU ops costed together in pass 2 (a block of the spill), one write batch each: a block is costed
# ahead while the one before is written, and the costed rows are held until written. Each block
# is a chain of small polars queries: blocks of 32K rather than 8K cost 0.3-0.8 CPU-s less on
# the 1 GB traces (0.25-0.9 s of wall), for ~10 MB more at the peak of linking (which stays
# below reading's); 64K took 440 MB
COST_BLOCK_ROWS = 1 << 15
# GPU ops written together in pass 2 (the wide rows, long kernel names, are its memory)
WRITE_BATCH_ROWS = 1 << 15
GROUP_ROWS = 1 << 15  # rows of a row group of the rewritten gpu_ops: ~25% smaller than one per batch


def link_pass(
    flat_dir: Path,
    spill: Path,
    dtype: str | None,
    tally: Tally | None = None,
    user: UserFormulas | None = None,
    replays: graphs.GraphLinks | Future[graphs.GraphLinks | None] | None = None,
    graph_ids: GraphIds | None = None,
    parts: int = 1,
) -> OpKernels:
    """Link the GPU ops batch by batch, cost their ops (everything that reads the events) and
    categorise them into `spill`: event_idx, the link columns, op_instance, OP_COST_COLUMNS and
    KERNEL_INPUTS (pass 2 then reads no GPU op column but to copy it); link counts and the formula
    file's errors go to `tally` if given (batch groups count per trace themselves). `replays`: the
    trace's graph replays paired with their captures (`graphs.GraphLinks`), given their captured
    ops, or their pairing under way (waited for once the first batch is linked); `graph_ids`:
    the graphs its activity names (`graph_ids.GraphIds`), for the replays not paired. Returns
    the per-op kernel counts (`OpKernels`). Four batches are worked on at once, each in a thread
    of its own: the ops of one are costed while the next is nested (its CPU ops found around its
    launches), the slices around the launches of the one after are read, and the launches of
    the one after that are looked up (`link.link_batches`).

    `parts` > 1: the GPU ops are cut into that many runs of consecutive row groups
    (`link.gpu_parts`), each linked in a thread of its own (polars works without the GIL; one
    linking thread left a core idle: its small queries wait on each other), and spilled apart,
    the later ones appended to `spill` in order. A part reads its next batch only once it is
    done with the one before, so that two batches are in memory at once however many parts
    there are, as for one part reading its next batch ahead (`link.link_batches`): reading
    ahead in both parts held four, and the memory grew with the trace from one batch's (a
    trace of one batch) to four's."""
    runs = link.gpu_parts(flat_dir, parts) if parts > 1 else [None]
    fields = _spill_fields()
    if len(runs) == 1:
        with store.SpillWriter(spill, fields) as out:
            return _link_part(flat_dir, out, dtype, tally, user, replays, graph_ids, None, None, ahead=True)
    src = link.LinkSources.of(flat_dir)
    tallies = [Tally() if tally is not None else None for _ in runs]
    with ExitStack() as stack:
        paths = [spill] + [
            stack.enter_context(store.spill_file(spill.parent, f"{spill.stem}.{k}")) for k in range(1, len(runs))
        ]
        writers = [stack.enter_context(store.SpillWriter(p, fields)) for p in paths]
        with ThreadPoolExecutor(len(runs)) as pool:
            done = [
                pool.submit(_link_part, flat_dir, w, dtype, t, user, replays, graph_ids, groups, src, ahead=False)
                for w, t, groups in zip(writers, tallies, runs)
            ]
            results = [d.result() for d in done]
        for p, w in zip(paths[1:], writers[1:]):
            w.close()
            writers[0].append(p)
    op_kernels = results[0]
    for more in results[1:]:
        op_kernels.merge(more)
    if tally is not None:
        for t in tallies:
            assert t is not None
            tally.merge(t)
    return op_kernels


_SPILL_TYPES = {"library_task": pa.bool_()}  # the KERNEL_INPUTS gpu_ops does not declare, when not strings


def _spill_fields() -> list[pa.Field]:
    """The columns of pass 1's spill (`link_pass`)."""
    declared = {f.name: f for f in schema.table("gpu_ops").arrow_schema(schema.ALL_STAGES)}
    return [
        pa.field("event_idx", pa.int64()),
        *schema.table("gpu_ops").arrow_schema(("link",)),
        pa.field(OP_INSTANCE, pa.int64()),
        *(pa.field(c, OP_COST_TYPES.get(c, pa.string())) for c in OP_COST_COLUMNS),
        *(declared[c] if c in declared else pa.field(c, _SPILL_TYPES.get(c, pa.string())) for c in KERNEL_INPUTS),
    ]


def _link_part(
    flat_dir: Path,
    out: store.SpillWriter,
    dtype: str | None,
    tally: Tally | None,
    user: UserFormulas | None,
    replays: graphs.GraphLinks | Future[graphs.GraphLinks | None] | None,
    graph_ids: GraphIds | None,
    row_groups: list[int] | None,
    src: link.LinkSources | None,
    ahead: bool,
) -> OpKernels:
    """`link_pass` of the GPU ops of `row_groups` (None: all) into `out`; `ahead`: each batch's
    reads made while the one before is nested (`link.link_batches`), and nested while the one
    before that is costed. Nesting ahead of costing took a 1 GB trace of 667K GPU ops from
    3.98-4.22 s to 3.61-3.76 s of linking (the costing thread had waited on nesting, and nesting
    on costing), for ~20 MB more at the peak of the collective-dense bench trace (458-461 MB)."""
    op_kernels, memo, tasks = OpKernels(), Memo(), Memo()
    evaluated = Evaluated()  # shapes' costs, shared by the batches (`op_costs`)
    events = pl.scan_parquet(flat_dir / "events.parquet")
    carry = (*COST_INPUTS, *((graph_id_args.GRAPH, graph_id_args.NODE) if graph_ids else ()))
    batches = link.link_batches(flat_dir, carry=carry, row_groups=row_groups, src=src, ahead=ahead)
    linked = _classified(batches, op_kernels, tally, replays, graph_ids)
    for links in store.one_ahead(linked) if ahead else linked:
        costed = _with_op_costs(events, links, dtype, evaluated, user)
        op_kernels.shapes_recorded |= bool(costed["op_shapes"].any())
        op_kernels.launches_recorded |= bool(links["launch_event_idx"].is_not_null().any())
        out.write(with_library_task(with_category(costed, memo=memo), tasks))
    if tally is not None:
        tally.formula_errors.update(evaluated.errors)
    return op_kernels


def _classified(
    batches: Iterator[pl.DataFrame],
    op_kernels: OpKernels,
    tally: Tally | None,
    replays: graphs.GraphLinks | Future[graphs.GraphLinks | None] | None,
    graph_ids: GraphIds | None,
) -> Iterator[pl.DataFrame]:
    """Linked batches of GPU ops with their graph replays attached, their kernels' roles and math
    modes, counted (`tally`, `op_kernels`): what `_link_part` costs and categorises next. Replays
    still being paired are waited for once the first batch is linked."""
    roles, modes = Memo(), Memo()
    for links in batches:
        if isinstance(replays, Future):
            replays = replays.result()
        links = replays.attach(links) if replays is not None else graphs.without_graphs(links)
        if graph_ids is not None:  # replays not paired with a capture: their graph by Kineto's graph id
            links = graph_ids.label(links)
        if tally is not None:
            tally.add_links(links)
        links = with_named_mode(with_kernel_role(links, roles), modes)
        op_kernels.add(links)
        yield links


def _with_op_costs(
    events: pl.LazyFrame, links: pl.DataFrame, dtype: str | None, evaluated: Evaluated, user: UserFormulas | None
) -> pl.DataFrame:
    """A link batch with its ops' OP_COST_COLUMNS, by op_instance: a CPU op's from its args in the
    events, a captured op's (graph replays) from its args in `cpu_op_args_json`. A replayed kernel
    without a captured op gets the reason (`graphs.GRAPH_REASON`) as its op_reason."""
    captured = (pl.col("cpu_op_link") == graphs.GRAPH_CAPTURE).fill_null(False)
    ops = [op_costs(events, links.filter(~captured)[OP_INSTANCE], dtype, evaluated, user)]
    replayed = links.filter(captured)
    if replayed.height:
        captured_ops = replayed.select(event_idx=OP_INSTANCE, name="cpu_op_name", args_json="cpu_op_args_json").unique(
            "event_idx"
        )
        ops.append(op_costs(captured_ops.lazy(), captured_ops["event_idx"], dtype, evaluated, user))
    costs = pl.concat(ops, how="diagonal_relaxed").rename({"cpu_op_event_idx": OP_INSTANCE})
    out = links.join(costs, on=OP_INSTANCE, how="left", maintain_order="left")
    no_op = pl.col(OP_INSTANCE).is_null() & pl.col(graphs.GRAPH_REASON).is_not_null()
    return out.with_columns(op_reason=pl.when(no_op).then(pl.col(graphs.GRAPH_REASON)).otherwise("op_reason"))


class BatchCoster:
    """The link and cost columns of one batch of gpu_ops rows (`store.write_extended`'s `extend`),
    in order: link columns, op costs and categories from the spill of pass 1, kernel costs from
    `kernel_costs`, COST_BLOCK_ROWS of the spill at a time (the write batches as many: their
    wide rows are the memory of pass 2). Blocks are costed one ahead in a thread of their own
    (`store.one_ahead`), beside the thread reading gpu_ops and the one writing it."""

    def __init__(self, links: store.SpillReader, op_kernels: OpKernels, devs: pl.DataFrame, tally: Tally):
        self.links, self.op_kernels, self.devs, self.tally = links, op_kernels, devs, tally
        self._empty = self._cost(links.take(0))
        self._blocks = store.one_ahead(self._costed_blocks())
        self._costed = self._empty  # rows of the last block not handed out yet

    def __call__(self, batch: pl.DataFrame) -> pl.DataFrame:
        parts, have = [self._empty], 0
        while have < batch.height:
            if self._costed.is_empty():
                self._costed = next(self._blocks, self._empty)
                if self._costed.is_empty():
                    break
            part = self._costed.head(batch.height - have)
            self._costed = self._costed.slice(part.height)
            parts.append(part)
            have += part.height
        return pl.concat(parts)

    def _costed_blocks(self) -> Iterator[pl.DataFrame]:
        while not (spilled := self.links.take(COST_BLOCK_ROWS)).is_empty():
            yield self._cost(spilled)

    def _cost(self, spilled: pl.DataFrame) -> pl.DataFrame:
        recorded = pl.lit(self.op_kernels.shapes_recorded).alias("trace_shapes")
        launched = pl.lit(self.op_kernels.launches_recorded).alias("trace_launches")
        g = spilled.select(*KERNEL_INPUTS, *CAUSE_LINKS, OP_INSTANCE, *OP_COST_COLUMNS, recorded, launched)
        costed = kernel_costs(g, self.op_kernels.of(g[OP_INSTANCE]), self.devs)
        self.tally.add_costs(costed)
        return spilled.select("event_idx", *LINKED).hstack(costed.select(COST_COLUMNS))


def enrich(
    flat_dir,
    row: dict,
    device_specs: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    formulas: UserFormulas | None = None,
    captures: list[CapturedGraphs] | None = None,
) -> list[str]:
    """Link and cost a freshly flattened directory in place; update the trace row. Returns warnings
    (devices without specs, formula-file entries that failed on this trace's ops).

    Two passes over the GPU ops, batch by batch, so that memory does not grow with the trace:
    1. link them (`link.link_batches`) and cost their CPU ops (`op_costs`) into a temporary Arrow
       file beside the tables, counting per CPU op its kernels and their time: the only thing
       the cost of a batch needs from the other batches (an op's FLOPs are split over all its
       kernels);
    2. rewrite gpu_ops.parquet batch by batch (`store.write_extended`) with the columns of pass 1
       read back and the kernels' costs (`BatchCoster`): only the write reads gpu_ops.
    Graph replays are paired with the graphs `captures` hold first (`graphs.GraphLinks`).
    """
    flat_dir = Path(flat_dir)
    gpu_ops = flat_dir / "gpu_ops.parquet"
    devs, warnings = matched_devices(flat_dir, device_specs, device)
    store.sort_by_key(gpu_ops, "gpu_ops")  # flatten writes it sorted already
    tally = Tally()
    with (
        store.arrow_memory_returned_promptly(),
        store.spill_file(flat_dir, LINK_SPILL) as spill,
        store.spill_file(flat_dir, GRAPH_SPILL) as graph_spill,
    ):
        # the replays are paired in a thread of their own while the first batches are linked: done
        # first, it took 0.29 s of a 1 GB trace's 3,010 replays on one core, the other one idle
        with ThreadPoolExecutor(1) as pairing:  # on an error, the pairing ends before its spill goes
            replays = pairing.submit(graphs.GraphLinks.of, flat_dir, captures or [], graph_spill)
            op_kernels = link_pass(
                flat_dir, spill, dtype, tally, formulas, replays, GraphIds.of(gpu_ops), parts=LINK_PARTS
            )
        if (paired := replays.result()) is not None:  # its counts first, as when it was paired first
            counts = Counter(paired.problems)
            counts.update(tally.links)
            tally.links = counts
        with store.SpillReader(spill) as links, store.atomic_file(gpu_ops) as tmp:
            coster = BatchCoster(links, op_kernels, devs, tally)
            store.write_extended(
                gpu_ops,
                tmp,
                "gpu_ops",
                coster,
                inputs=["event_idx"],
                batch_rows=WRITE_BATCH_ROWS,
                group_rows=GROUP_ROWS,
            )
    store.write_table(devs.to_arrow(), flat_dir / "devices.parquet", "devices")
    tally.row_update(row)
    return warnings + [f"{where}: failed on this trace's ops: {why}" for where, why in tally.formula_errors.items()]
