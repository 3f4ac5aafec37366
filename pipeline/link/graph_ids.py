"""graph_ids: graph-replayed activity grouped by the graph ids Kineto records, without a capture trace.

Since 2026-02 (pytorch/kineto #1276) Kineto writes CUPTI's `graph id` and `graph node id` in the args
of the kernels (and copies, fills) a CUDA 12+ graph ran: which graph, which node of it (0: none).
Where a replay was not paired with a captured graph (`link.graphs`: no capture trace, or none
matched), its activity is one graph, `graph id <n>`, whatever its kernels (no hash of them needed),
and `graph_node` the place of its node among the graph's nodes the trace ran, in node id order
(CUDA numbers nodes as they are created: capture order). Its launch is its graph launch (the same
correlation id) and its CPU context the op, step, annotation and module around that launch, as link
gives every launch.

The nodes of every graph are read once (a few per graph), then each link batch is labelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

PREFIX = "graph id "  # graph_id of a graph known by Kineto's graph id only
GRAPH, NODE = "kineto_graph_id", "kineto_graph_node_id"  # the gpu_ops columns of the args
UNCAPTURED_PREFIXES = ("uncaptured", PREFIX)  # graph_ids that name no capture trace


@dataclass(frozen=True)
class GraphIds:
    """(graph, node id) -> graph_node of the graphs a trace's activity names."""

    nodes: pl.DataFrame  # GRAPH, NODE, graph_node

    @classmethod
    def of(cls, gpu_ops: Path) -> GraphIds | None:
        """The graphs of a flattened trace's GPU ops (None: no activity names one)."""
        if GRAPH not in pl.scan_parquet(gpu_ops).collect_schema().names():
            return None  # flattened before the columns existed
        nodes = (
            pl.scan_parquet(gpu_ops).filter(pl.col(GRAPH) > 0).select(GRAPH, NODE).unique().collect(engine="streaming")
        )
        if nodes.is_empty():
            return None
        ranked = nodes.sort(GRAPH, NODE, nulls_last=True).with_columns(
            graph_node=pl.when(pl.col(NODE).is_not_null()).then(pl.int_range(pl.len(), dtype=pl.Int64).over(GRAPH))
        )
        return cls(ranked)

    def label(self, links: pl.DataFrame) -> pl.DataFrame:
        """A link batch (with GRAPH and NODE carried) with graph_id and graph_node of the activity a
        named graph ran and no captured graph was paired with."""
        found = links.select(GRAPH, NODE).join(self.nodes, on=[GRAPH, NODE], how="left", maintain_order="left")
        named = (pl.col(GRAPH) > 0).fill_null(False)
        unpaired = pl.col("graph_node").is_null()
        return links.with_columns(
            graph_id=pl.when(named & unpaired)
            .then(pl.lit(PREFIX) + pl.col(GRAPH).cast(pl.String))
            .otherwise(pl.col("graph_id")),
            graph_node=pl.when(named & unpaired).then(found["graph_node"]).otherwise(pl.col("graph_node")),
        )
