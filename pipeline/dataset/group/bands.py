"""bands: the ids a link joins on made unique per member of a group: the k-th member's moved to
the band k * BAND (`banded`); a member whose ids do not fit a band goes alone (`fits`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.dataset.group.decode import Tables

BAND = 1 << 40  # the ids of the k-th trace of a group move to the band k * BAND
ID_LIMIT = 1 << 39  # ids within +-ID_LIMIT fit a band

# the columns linking matches on, per table: moved to their trace's band
_BANDED = {
    "events": ("pid", "correlation", "external_id"),
    "gpu_ops": ("pid", "correlation", "external_id"),
    "flows": ("pid", "id"),
}


def fits(t: Tables) -> np.ndarray:
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


def banded(tbl: pa.Table, name: str, owner: np.ndarray, offsets: np.ndarray) -> pa.Table:
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
