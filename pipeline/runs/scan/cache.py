"""cache: where a run folder's Extracts are kept, so that a second `tracepipe ranks` of the same
folder reads no trace again.

Location: `$TRACEPIPE_CACHE_DIR`, else `$XDG_CACHE_HOME/tracepipe`, else `~/.cache/tracepipe`;
a folder's Extracts go under `runs/<16 hex digits of the folder's absolute path>/`, one file per
trace (`<16 hex digits of the trace's path>.rank`). A file is used only while its trace has the
size and modification time (ns) it records, and was written by this tracepipe (version and
format): anything else is read again and the file replaced. `--no-cache` neither reads nor
writes it; `rm -rf ~/.cache/tracepipe/runs` (or the folder named) clears it. A cache that cannot
be written (read-only home) is skipped silently: the answer is the same, only slower next time.

File: `TPRANK1\\n`, the header's length (8 bytes, little endian), the header (JSON: format,
version, the Extract's info, each column's dtype, offset and length), then the columns, each
8-byte aligned. A run's calls are read a slice at a time (`CachedExtract.pg_slice`), never whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import orjson

from pipeline.files import folder_cache, path_key  # noqa: F401 - folder_cache: the folder of a run's entries
from pipeline.runs.calls import CALL_COLUMNS, STEP_COLUMNS, Extract
from pipeline.version import __version__

MAGIC = b"TPRANK1\n"
FORMAT = 3  # 2: the info holds the device vendor; 3: its base time (`base_time_ns`)


def entry(cache: Path, trace: str | Path) -> Path:
    return cache / f"{path_key(trace)}.rank"


def write(path: Path, ex: Extract) -> None:
    """Write an Extract (atomically: a reader sees the old file or the new one)."""
    blobs, columns, pos = [], {}, 0
    for part, table, spec in (("calls", ex.calls, CALL_COLUMNS), ("steps", ex.steps, STEP_COLUMNS)):
        for c in spec:
            b = np.ascontiguousarray(table[c], dtype=spec[c]).tobytes()
            columns[f"{part}.{c}"] = [pos, len(table[c])]
            blobs.append(b + b"\0" * (-len(b) % 8))
            pos += len(blobs[-1])
    head = orjson.dumps({"format": FORMAT, "version": __version__, "info": ex.info, "columns": columns})
    head += b" " * (-(len(MAGIC) + 8 + len(head)) % 8)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(MAGIC + len(head).to_bytes(8, "little") + head)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


class CachedExtract:
    """An Extract kept in a file: its info and steps read at once, its calls a slice at a time."""

    def __init__(self, path: Path, info: dict, columns: dict, start: int):
        self.path, self.info, self._columns, self._start = path, info, columns, start

    @property
    def steps(self) -> dict[str, np.ndarray]:
        """Read when asked (a run of 1,024 ranks holds no rank's steps but the one being measured)."""
        return {c: self._read(f"steps.{c}", STEP_COLUMNS[c], 0, None) for c in STEP_COLUMNS}

    def _read(self, name: str, dtype, a: int, b: int | None) -> np.ndarray:
        offset, n = self._columns[name]
        b = n if b is None else min(b, n)
        a = min(a, b)
        size = np.dtype(dtype).itemsize
        return np.fromfile(self.path, dtype=dtype, count=b - a, offset=self._start + offset + a * size)

    def pg_slice(self, pg: int, start: int, stop: int) -> dict[str, np.ndarray]:
        """The calls of local group `pg` with seq in [start, stop): one open, a read per column."""
        first, n = self.info["pgs"][pg]["offset"], self.info["pgs"][pg]["n"]
        a, b = first + min(start, n), first + min(stop, n)
        out = {}
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for c, t in CALL_COLUMNS.items():
                offset, _ = self._columns[f"calls.{c}"]
                size = np.dtype(t).itemsize
                data = os.pread(fd, (b - a) * size, self._start + offset + a * size)
                out[c] = np.frombuffer(data, dtype=t)
        finally:
            os.close(fd)
        return out

    def column(self, name: str) -> np.ndarray:
        """A whole call column (`ts`, say): for one rank's share of a run, not for a run."""
        return self._read(f"calls.{name}", CALL_COLUMNS[name], 0, None)

    def load(self) -> Extract:
        return Extract(self.info, {c: self.column(c) for c in CALL_COLUMNS}, self.steps)


def read(path: Path, source: str | None = None) -> CachedExtract | None:
    """The Extract in `path`, if it is one of this tracepipe's and (given `source`, a trace file)
    still that file's: same size and modification time. None otherwise."""
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            n = int.from_bytes(f.read(8), "little")
            head = orjson.loads(f.read(n))
    except (OSError, orjson.JSONDecodeError):
        return None
    if head.get("format") != FORMAT or head.get("version") != __version__:
        return None
    info = head["info"]
    if source is not None:
        try:
            st = os.stat(source)
        except OSError:
            return None
        if (
            info.get("source") != str(source)
            or info.get("size") != st.st_size
            or info.get("mtime_ns") != st.st_mtime_ns
        ):
            return None
    return CachedExtract(path, info, head["columns"], len(MAGIC) + 8 + n)
