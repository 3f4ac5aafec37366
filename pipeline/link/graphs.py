"""graphs: GPU activity replayed by CUDA/HIP graph launches, paired with the graph that captured it.

A *replay* is the GPU activity sharing one graph launch's correlation id (`cudaGraphLaunch`,
`hipGraphLaunch`, `cuGraphLaunch`: `kineto.GRAPH_LAUNCH`); its launch is the graph launch, and no CPU
op of the replay trace issued its kernels. A *captured graph* is the calls a capture trace recorded
between a thread's Begin- and EndCapture (`captures.captured_graphs`), each inside the CPU op that
issued it, with its shapes. A replay is paired with a captured graph by its activity:

1. **Candidates**: the captured graphs with the same multiset of activities, compared at the finest
   level both sides record: kind (kernel / memcpy / memset), kernel name, and grid and block when
   both sides have them (HIP's capture records names, grids and blocks, its replayed kernels no
   grids; CUDA's capture records none of them: its graphs are compared by count and kind only, and
   the kernels so paired are counted, `graphs:paired_by_kind_and_order`). Multisets, not sequences:
   a multi-stream graph's kernels may start in another order than they were captured.
2. **One graph among several**: candidates that give every kernel the same op (name and shapes)
   are equivalent. Among candidates that are not, the graph captured right after the one the
   previous replay on the same thread was paired with (piecewise graphs replay in capture order:
   vLLM's 25 pieces of one forward) is taken; the possible graphs of an unresolved replay are kept
   for the next one. A replay whose candidates still differ in their ops is not paired: counted
   (`unlinked:graph_replay_ambiguous`), never guessed.
3. **Kernel to node**: within a paired replay, the k-th kernel (in start order) of each activity
   key is the k-th node of that key in capture order. Where kernels of one key ran on several
   streams and their nodes' ops differ, the order between streams is not known: those kernels are
   counted (`graphs:kernel_order_ambiguous`).

A paired kernel gets the node's op (`cpu_op_link` = `graph_capture`; `cpu_op_event_idx` is the op's
event in the capture trace `capture_trace_id`, its args in `cpu_op_args_json`), `graph_id`,
`graph_node` and `capture_launch_dur_ns`; its launch stays the graph launch, its context (step,
annotation, module) the replay's. An op's FLOPs are split over its kernels within one replay (each
replay does the op's work again): `op_instance` keys that split, negative for a (replay, op) so it
never meets an op of the replay trace. Unpaired replays keep the context around their launch and
get `graph_id` = `uncaptured#<hash of their kernels>`, with the reason counted.

Memory: the captured nodes (small) and about REPLAY_KERNELS replayed activities at a time; the pairs are spilled to a
Parquet file that each link batch reads by its event_idx range.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from pipeline.kineto import BLIT_KERNELS, GRAPH_LAUNCH, LAUNCH_CAT
from pipeline.link import links as link
from pipeline.link.captures import NODE_SCHEMA, CapturedGraphs
from pipeline.read.durations import SLICE
from pipeline.store import scalar_int

GRAPH_COLUMNS = ["graph_id", "graph_node", "capture_trace_id", "cpu_op_args_json", "capture_launch_dur_ns"]
OP_INSTANCE = "op_instance"  # whose FLOPs a kernel shares (`enrich`): its op, or (replay, captured op)
GRAPH_REASON = "graph_reason"  # why a replayed kernel has no captured op (its unmodelled_reason)
GRAPH_CAPTURE = "graph_capture"  # the cpu_op_link of a paired kernel
REPLAY_KERNELS = 1 << 16  # replayed activities paired together, about (their launches' kernels read at once)
# why a replayed kernel has no op: its unmodelled_reason, a cause of `pipeline.cost.coverage` each
NO_CAPTURE, UNMATCHED, AMBIGUOUS = "graph_replay", "graph_replay_unmatched", "graph_replay_ambiguous"
PROBLEM = {
    NO_CAPTURE: "unlinked:graph_replay_without_capture (pass the trace its graphs were captured in: --graph-capture)",
    UNMATCHED: "unlinked:graph_replay_matching_no_captured_graph",
    AMBIGUOUS: "unlinked:graph_replay_ambiguous (captured graphs with its kernels differ in their ops)",
}
_KEY_BITS = 40  # bits of each activity key's hash; a replay's is their sum (room for 2^23 kernels in int64)
_ARGS = ("Input Dims", "Input type", "Concrete Inputs")  # what makes two captured ops the same work
LEVELS = ("kind", "name", "full")  # of activity keys, coarse to fine (`_keys`)
_PAIRED_COUNTS = (  # the counts of paired kernels each batch adds to the trace's problems
    "link:cpu_op_by_graph_capture",
    "graphs:paired_by_kind_and_order (the capture records no kernel names)",
    "graphs:kernel_order_ambiguous (one key on several streams, captured by different ops)",
)
_SPILL = {
    "event_idx": pl.Int64,
    "node_ref": pl.Int64,
    "graph_id": pl.String,
    OP_INSTANCE: pl.Int64,
    GRAPH_REASON: pl.String,
    "order_ambiguous": pl.Boolean,
}
_GPU = [
    "event_idx",
    "correlation",
    "kind",
    "name",
    "stream",
    "ts_ns",
    "dur_ns",
    *(f"{d}_{a}" for d in ("grid", "block") for a in "xyz"),
]


class _KeyHashes:
    """Stable 40-bit hashes of activity keys (BLAKE2b: the same in every run), each computed once."""

    def __init__(self) -> None:
        self.memo: dict[str, int] = {}

    def of(self, keys: pl.Series) -> pl.Series:
        new = [k for k in keys.unique().drop_nulls() if k not in self.memo]
        for k in new:
            self.memo[k] = int.from_bytes(hashlib.blake2b(k.encode(), digest_size=5).digest(), "big")
        return keys.replace_strict(self.memo, default=None, return_dtype=pl.Int64)


def _keys(frame: pl.DataFrame, full: bool = True) -> pl.DataFrame:
    """Activity keys at each level: `k_kind` (kind), `k_name` (kind and kernel name), `k_full` (and
    grid and block; null where they are not recorded; left out when not `full`)."""
    kernel = pl.col("kind") == "kernel"
    name = pl.concat_str(pl.col("kind"), pl.when(kernel).then(pl.col("name")).otherwise(pl.lit("")), separator="\x1f")
    out = frame.with_columns(
        k_kind=pl.col("kind"), k_name=pl.when(kernel & pl.col("name").is_null()).then(None).otherwise(name)
    )
    if not full:
        return out
    dims = [pl.col(f"{d}_{a}").cast(pl.String) for d in ("grid", "block") for a in "xyz"]
    grid = pl.when(kernel & pl.col("grid_x").is_not_null()).then(
        pl.concat_str(pl.col("k_name"), *dims, separator="\x1f")
    )
    return out.with_columns(k_full=pl.when(kernel).then(grid).otherwise(pl.col("k_name")))


def _hashed(frame: pl.DataFrame, hashes: _KeyHashes, levels: tuple[str, ...] = LEVELS) -> pl.DataFrame:
    return frame.with_columns(**{f"h_{lvl}": hashes.of(frame[f"k_{lvl}"]) for lvl in levels})


def _sums(frame: pl.DataFrame, by: str, levels: tuple[str, ...] = LEVELS) -> pl.DataFrame:
    """Per `by`: activity count and, per level, the sum of its keys' hashes (null if a key is)."""

    def total(lvl: str) -> pl.Expr:
        h = pl.col(f"h_{lvl}")
        return pl.when(h.null_count() == 0).then(h.sum())

    return frame.group_by(by).agg(n=pl.len(), **{lvl: total(lvl) for lvl in levels})


def _op_signature(nodes: pl.DataFrame) -> pl.Expr:
    """A captured op's name and the args that make its work (the same for ops doing the same work)."""
    a = pl.col("cpu_op_args_json")
    return pl.concat_str(
        pl.col("cpu_op_name").fill_null(""), *(a.str.json_path_match(f"$['{k}']").fill_null("") for k in _ARGS)
    )


class _Graphs:
    """Every captured graph of the capture traces given, numbered in order (`gidx`), with what
    pairing looks up: candidates by activity multiset, ops equivalence, the next graph captured."""

    def __init__(self, captures: list[CapturedGraphs], hashes: _KeyHashes):
        parts = [c.nodes for c in captures if c.nodes.height]
        offsets, at = [], 0
        for p in parts:  # graphs numbered across the captures, in the order given
            offsets.append(at)
            at += scalar_int(p["graph"].max()) + 1
        nodes = (
            pl.concat([p.with_columns(gidx=pl.col("graph") + o) for p, o in zip(parts, offsets)])
            if parts
            else pl.DataFrame(schema={**NODE_SCHEMA, "gidx": pl.Int64})
        )
        nodes = nodes.with_columns(node_ref=pl.int_range(pl.len(), dtype=pl.Int64))
        self.nodes = _hashed(_keys(nodes), hashes).with_columns(op_sig=_op_signature(nodes))
        per = _sums(self.nodes, "gidx").sort("gidx")
        order = self.nodes.group_by("gidx").agg(
            pl.col("capture_trace_id").first(), pl.col("graph").first(), pl.col("capture").first()
        )
        per = per.join(order, on="gidx").sort("gidx")
        self.n = per.height
        self.label = dict(zip(per["gidx"], per["capture"] + "#" + per["graph"].cast(pl.String)))
        self.named = dict(zip(per["gidx"], per["name"].is_not_null()))
        self.full = dict(zip(per["gidx"], per["full"]))
        self.by_name: dict[tuple, list[int]] = {}
        self.by_kind: dict[tuple, list[int]] = {}
        for g, n, kind, name in per.select("gidx", "n", "kind", "name").iter_rows():
            if name is not None:
                self.by_name.setdefault((n, name), []).append(g)
            else:
                self.by_kind.setdefault((n, kind), []).append(g)
        # the graph captured next in the same trace
        nxt = per.select("gidx", nxt=pl.col("gidx").shift(-1).over("capture_trace_id", order_by="graph"))
        self.next = {g: x for g, x in nxt.iter_rows() if x is not None}
        eq = (
            self.nodes.sort("gidx", "node")
            .group_by("gidx", maintain_order=True)
            .agg(
                pl.concat_str(pl.col("k_name").fill_null(pl.col("k_kind")), "op_sig", separator="\x1e").str.join("\x1d")
            )
        )
        self.same_work = dict(zip(eq["gidx"], eq[eq.columns[1]]))
        # per level, each node's key and its rank among the graph's nodes of that key
        self.ranked = pl.concat(
            self.nodes.sort("gidx", "node").select(
                "gidx",
                "node_ref",
                "op_sig",
                level=pl.lit(lvl),
                key=pl.col(f"k_{lvl}"),
                rank=pl.int_range(pl.len(), dtype=pl.UInt32).over("gidx", f"k_{lvl}"),
            )
            for lvl in LEVELS
        ).filter(pl.col("key").is_not_null())

    def candidates(self, n: int, kind: int, name: int, full: int | None) -> list[int]:
        """The graphs whose activities are the replay's (n of them; its key hash sums per level)."""
        named = self.by_name.get((n, name), [])
        if full is not None:
            named = [g for g in named if self.full[g] is None or self.full[g] == full]
        return named + self.by_kind.get((n, kind), [])

    def level(self, g: int, full: int | None) -> str:
        """The finest level a replay (full: its grid-level sum, None without grids) is compared at."""
        if full is not None and self.full[g] is not None:
            return "full"
        return "name" if self.named[g] else "kind"


@dataclass
class _Choice:
    """The pairing of one replay: its graph (None: unpaired, with the reason)."""

    gidx: int | None
    reason: str | None
    level: str | None = None
    label: str | None = None  # its graph_id


class _Chooser:
    """Picks a replay's graph among its candidates (rule 2 of the module docstring), replay after
    replay in launch order, keeping per launching thread the graphs the last replay may have been."""

    def __init__(self, graphs: _Graphs):
        self.g = graphs
        self.after: dict[tuple, set[int]] = {}  # thread -> the graphs its last replay may have been

    def choose(self, thread: tuple, n: int, kind: int, name: int, full: int | None) -> _Choice:
        uncaptured = f"uncaptured#{(kind if name is None else name) % (1 << 32):08x}"
        if not self.g.n:
            return _Choice(None, NO_CAPTURE, label=uncaptured)
        cands = self.g.candidates(n, kind, name, full)
        if not cands:
            self.after.pop(thread, None)
            return _Choice(None, UNMATCHED, label=uncaptured)
        before = self.after.get(thread, set())
        following = {self.g.next[g] for g in before if g in self.g.next}
        narrowed = [g for g in cands if g in following] or cands
        self.after[thread] = set(narrowed)
        if len({self.g.same_work[g] for g in narrowed}) > 1:
            return _Choice(None, AMBIGUOUS, label=uncaptured)
        g = narrowed[0]
        return _Choice(g, None, self.g.level(g, full), self.g.label[g])


@dataclass
class GraphLinks:
    """The pairs of a trace's graph-replayed activity with captured nodes (spilled to `pairs`),
    the captured nodes, and the counts for `trace.problems_json`."""

    pairs: Path
    nodes: pl.DataFrame
    problems: Counter

    @classmethod
    def of(cls, flat_dir: Path, captures: list[CapturedGraphs], spill: Path) -> GraphLinks | None:
        """Pair the graph replays of a flattened trace (None: it has no graph launch)."""
        flat_dir = Path(flat_dir)
        launches = _graph_launches(flat_dir / "events.parquet")
        if launches.is_empty():
            return None
        problems: Counter = Counter()
        for c in captures:
            problems.update(c.problems)
        hashes = _KeyHashes()
        graphs = _Graphs(captures, hashes)
        chooser = _Chooser(graphs)
        used: set[int] = set()
        writer = None
        try:
            for rows in _pair_all(flat_dir / "gpu_ops.parquet", launches, graphs, chooser, hashes, problems, used):
                table = rows.select([pl.col(c).cast(t) for c, t in _SPILL.items()]).to_arrow()
                writer = writer or pq.ParquetWriter(spill, table.schema)
                writer.write_table(table)
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            pl.DataFrame(schema=_SPILL).write_parquet(spill)
        problems["graphs:captured_graphs"] += graphs.n
        problems["graphs:captured_graphs_not_replayed"] += graphs.n - len(used)
        nodes = graphs.nodes.select(
            "node_ref",
            "capture_trace_id",
            "cpu_op_args_json",
            graph_node="node",
            captured_op="cpu_op_event_idx",
            captured_op_name="cpu_op_name",
            capture_launch_dur_ns="launch_dur_ns",
        )
        return cls(spill, nodes, problems)

    def attach(self, links: pl.DataFrame) -> pl.DataFrame:
        """A link batch (`links.link_batches`) with the graph columns, `op_instance` and the reason
        unpaired replayed kernels have no op; paired kernels given their captured op."""
        pairs = link.read_where(self.pairs, link.among("event_idx", links["event_idx"]), list(_SPILL))
        pairs = pairs.join(self.nodes, on="node_ref", how="left")
        out = links.join(pairs, on="event_idx", how="left", maintain_order="left")
        paired = pl.col("node_ref").is_not_null()
        captured = pl.when(pl.col("captured_op").is_not_null()).then(pl.lit(GRAPH_CAPTURE))
        mine = lambda c, theirs: pl.when(paired).then(c).otherwise(pl.col(theirs))
        return out.with_columns(
            cpu_op_event_idx=mine(pl.col("captured_op"), "cpu_op_event_idx"),
            cpu_op_name=mine(pl.col("captured_op_name"), "cpu_op_name"),
            cpu_op_link=mine(captured, "cpu_op_link"),
            op_instance=mine(pl.col(OP_INSTANCE), "cpu_op_event_idx"),
        ).select(*links.columns, *GRAPH_COLUMNS, OP_INSTANCE, GRAPH_REASON)


def without_graphs(links: pl.DataFrame) -> pl.DataFrame:
    """A link batch of a trace without graph launches (or linked without pairing), as `attach` gives it."""
    types = {c: NODE_TYPES.get(c, pl.String) for c in GRAPH_COLUMNS}
    return links.with_columns(
        *(pl.lit(None, types[c]).alias(c) for c in GRAPH_COLUMNS),
        pl.col("cpu_op_event_idx").alias(OP_INSTANCE),
        pl.lit(None, pl.String).alias(GRAPH_REASON),
    )


NODE_TYPES = {"graph_node": pl.Int64, "capture_launch_dur_ns": pl.Int64}


def _graph_launches(events: Path) -> pl.DataFrame:
    """(correlation, launch_event_idx, pid, tid, ts_ns) of the graph launch calls, in time order."""
    is_call = SLICE & pl.col("cat").str.contains(LAUNCH_CAT)
    names = (
        pl.scan_parquet(events)
        .filter(is_call)
        .select(pl.col("name").cast(pl.String))
        .unique()
        .collect(engine="streaming")["name"]
        .drop_nulls()
    )
    graph_launch = [n for n in names if re.match(GRAPH_LAUNCH, n)]
    if not graph_launch:
        return pl.DataFrame(schema={"correlation": pl.Int64, "launch_event_idx": pl.Int64})
    return (
        link.read_where(
            events,
            is_call & pl.col("name").is_in(graph_launch) & pl.col("correlation").is_not_null(),
            ["correlation", pl.col("event_idx").alias("launch_event_idx"), "pid", "tid", "ts_ns"],
        )
        .sort("ts_ns", "launch_event_idx")
        .unique("correlation", keep="first", maintain_order=True)
    )


def _pair_all(
    gpu_ops: Path,
    launches: pl.DataFrame,
    graphs: _Graphs,
    chooser: _Chooser,
    hashes: _KeyHashes,
    problems: Counter,
    used: set[int],
) -> Iterator[pl.DataFrame]:
    """The spill rows (_SPILL) of every replay, about REPLAY_KERNELS activities at a time (the
    launches of a batch sized by the kernels per launch of the batch before)."""
    start, n = 0, 64
    while start < launches.height:
        batch = launches.slice(start, n)
        start += batch.height
        kernels = link.read_where(gpu_ops, link.among("correlation", batch["correlation"]), _GPU)
        kernels = kernels.with_columns(pl.col("name").cast(pl.String), _node_kind(pl.col("kind").cast(pl.String)))
        n = max(1, min(4 * n, REPLAY_KERNELS * batch.height // max(1, kernels.height)))
        if kernels.is_empty():
            continue
        if not graphs.n:
            yield _uncaptured_batch(kernels, hashes, problems)
            continue
        yield _pair_batch(batch, _hashed(_keys(kernels), hashes), graphs, chooser, problems, used)


def _uncaptured_batch(kernels: pl.DataFrame, hashes: _KeyHashes, problems: Counter) -> pl.DataFrame:
    """`_pair_batch` when no graph was captured: every replay unpaired (NO_CAPTURE), named by the
    hash of its activities as `_Chooser.choose` names it, without the pairing's keys and joins
    (measured on 1 GB of hta/diff_test_v100, 171K replayed kernels: see the performance history)."""
    k = _hashed(_keys(kernels, full=False), hashes, LEVELS[:2])
    sums = _sums(k, "correlation", LEVELS[:2])
    labels = {
        corr: f"uncaptured#{(kind if name is None else name) % (1 << 32):08x}"
        for corr, name, kind in sums.select("correlation", "name", "kind").iter_rows()
    }
    problems["graphs:replays"] += sums.height
    for key in _PAIRED_COUNTS:
        problems[key] += 0  # as `_pair_batch` counts them: none paired
    problems[PROBLEM[NO_CAPTURE]] += k.height
    return k.select(
        "event_idx",
        node_ref=pl.lit(None, pl.Int64),
        graph_id=pl.col("correlation").replace_strict(labels, return_dtype=pl.String),
        op_instance=pl.lit(None, pl.Int64),
        graph_reason=pl.lit(NO_CAPTURE),
        order_ambiguous=pl.lit(False),
    ).sort("event_idx")


def _node_kind(kind: pl.Expr) -> pl.Expr:
    """The kind of node a replayed activity stands for: its own, or memcpy / memset for the blit
    kernels that run them (`kineto.BLIT_KERNELS`)."""
    out = kind
    for node_kind, pattern in reversed(BLIT_KERNELS):
        out = pl.when((kind == "kernel") & pl.col("name").str.contains(pattern)).then(pl.lit(node_kind)).otherwise(out)
    return out.alias("kind")


def _pair_batch(
    launches: pl.DataFrame,
    kernels: pl.DataFrame,
    graphs: _Graphs,
    chooser: _Chooser,
    problems: Counter,
    used: set[int],
) -> pl.DataFrame:
    sums = _sums(kernels, "correlation").join(
        kernels.group_by("correlation").agg(streams=pl.col("stream").n_unique()), on="correlation"
    )
    replays = launches.join(sums, on="correlation", how="inner", maintain_order="left")
    chosen = []
    for corr, pid, tid, n, kind, name, full in replays.select(
        "correlation", "pid", "tid", "n", "kind", "name", "full"
    ).iter_rows():
        c = chooser.choose((pid, tid), n, kind, name, full)
        chosen.append((corr, c.gidx, c.level, c.reason, c.label))
        problems["graphs:replays"] += 1
        if c.gidx is not None:
            used.add(c.gidx)
            problems["graphs:replays_paired"] += 1
    choice = pl.DataFrame(
        chosen,
        schema={
            "correlation": pl.Int64,
            "gidx": pl.Int64,
            "level": pl.String,
            GRAPH_REASON: pl.String,
            "graph_id": pl.String,
        },
        orient="row",
    )
    k = kernels.join(choice, on="correlation", how="left")
    k = k.with_columns(
        key=pl.when(pl.col("level") == "full")
        .then(pl.col("k_full"))
        .when(pl.col("level") == "name")
        .then(pl.col("k_name"))
        .otherwise(pl.col("k_kind"))
    ).sort("correlation", "ts_ns", "event_idx")
    k = k.with_columns(rank=pl.int_range(pl.len(), dtype=pl.UInt32).over("correlation", "key"))
    k = k.join(graphs.ranked, on=["gidx", "level", "key", "rank"], how="left")
    # kernels of one key on several streams whose nodes' ops differ: their order is not known
    k = k.with_columns(
        order_ambiguous=(
            (pl.col("stream").n_unique().over("correlation", "key") > 1)
            & (pl.col("op_sig").n_unique().over("correlation", "key") > 1)
        ).fill_null(False)
    )
    k = k.join(graphs.nodes.select("node_ref", "cpu_op_event_idx"), on="node_ref", how="left")
    instance = ["correlation", "gidx", "cpu_op_event_idx"]
    has_op = pl.col("cpu_op_event_idx").is_not_null()
    k = k.with_columns(op_instance=pl.when(has_op).then(-1 - pl.col("event_idx").min().over(instance)))
    paired = pl.col("node_ref").is_not_null()
    counts = k.select(
        by_capture=(paired & has_op).sum(),
        by_kind=(paired & (pl.col("level") == "kind")).sum(),
        ambiguous=(paired & pl.col("order_ambiguous")).sum(),
    ).row(0, named=True)
    for key, n in zip(_PAIRED_COUNTS, (counts["by_capture"], counts["by_kind"], counts["ambiguous"])):
        problems[key] += n
    for reason, n in k.filter(~paired).group_by(GRAPH_REASON).len().iter_rows():
        problems[PROBLEM[reason or UNMATCHED]] += n
    return k.select(list(_SPILL)).sort("event_idx")


def graph_hint(problems: dict) -> str | None:
    """One line on the graph replays of a trace that got no captured op, and what to do (None: every
    replay was paired, or there are none)."""
    replays, paired = problems.get("graphs:replays", 0), problems.get("graphs:replays_paired", 0)
    if replays == paired:
        return None
    if problems.get(PROBLEM[NO_CAPTURE]):
        return (
            f"{replays:,} CUDA/HIP graph replays ({problems[PROBLEM[NO_CAPTURE]]:,} kernels) are attributed to the "
            "code around their launch only: pass the trace their graphs were captured in with --graph-capture "
            "(vLLM and SGLang write it to capture_traces/)"
        )
    why = ", ".join(
        f"{problems[PROBLEM[r]]:,} kernels {what}"
        for r, what in ((UNMATCHED, "match no captured graph"), (AMBIGUOUS, "match captured graphs of different ops"))
        if problems.get(PROBLEM[r])
    )
    return f"{replays - paired:,} of {replays:,} CUDA/HIP graph replays not paired with a captured graph ({why})"
