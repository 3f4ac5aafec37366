"""batch: many traces -> one hive-partitioned Parquet dataset, incrementally and crash-safely.

Dataset layout (every table of `flatten`, plus the `traces` manifest):

    DATASET/<table>/trace_id=<id>/part-0.parquet   table: events gpu_ops flows devices trace
    DATASET/traces/trace_id=<id>/part-0.parquet    one manifest row per input content
    DATASET/_staging/                              work in progress (removed on the next start)

`trace_id` is `t` + the first 16 hex digits of the BLAKE2b hash of the file's bytes: the same
content is the same trace wherever it lies, and the letter keeps DuckDB and polars from reading
the partition value as a number. The column lives only in the directory name (the data files
carry no `trace_id` column, so nothing clashes; the `trace` table's `source_path` names the
input, ARCHIVE!MEMBER for archive members): read with hive partitioning, e.g. DuckDB
`read_parquet('DATASET/events/**/*.parquet', hive_partitioning=true)` or polars
`scan_parquet('DATASET/events/**/*.parquet', hive_partitioning=True)`.

Commit protocol: each trace is flattened into `_staging/<run>/<id>/`, each table's partition
directory is renamed into place, and the manifest row is renamed into place last. A trace is in
the dataset only when its manifest row is; on start a run removes `_staging/` and any partition
without a manifest row, so a run killed at any moment (kill -9) leaves neither duplicates nor
orphans, and the next run picks up where it stopped. Inputs whose content hash is already in the
manifest are skipped, so a re-run only hashes files. Bad inputs are committed as manifest rows
with status `quarantined` and their reason (re-runs report them again without re-reading them);
a failure that is not the file's fault (a worker that died, a bug) commits nothing and is retried
by the next run.

Running on a cluster with object storage: `--engine ray` runs each trace's flatten as a Ray task
(`ray.init()` joins the cluster named by RAY_ADDRESS, else starts a local one) and `--engine dask`
as a Dask task (the scheduler named by DASK_SCHEDULER_ADDRESS, else a LocalCluster with `-j`
workers); install them with `pip install 'tracepipe[ray]'` or `'tracepipe[dask]'`. The driver
decides what to do and commits; the workers read inputs and write staging files, so SRC and
DATASET must be paths that every worker sees: a shared POSIX filesystem (NFS, Lustre, EFS) or an
object-store bucket mounted with a FUSE driver (mountpoint-s3, gcsfuse, blobfuse2) at the same
path on every node. The commit relies on atomic directory renames, which bare object stores lack,
so to publish to S3/GCS build the dataset on such a filesystem (or locally) and then copy it, e.g.
`aws s3 sync DATASET s3://bucket/ds --exclude '_staging/*'`. Readers then query the bucket
directly: DuckDB `read_parquet('s3://bucket/ds/events/**/*.parquet', hive_partitioning=true)`
(httpfs extension), polars `pl.scan_parquet('s3://bucket/ds/events/**/*.parquet',
hive_partitioning=True, storage_options={...})`, pyarrow `pyarrow.dataset.dataset(
'bucket/ds/events', filesystem=pyarrow.fs.S3FileSystem(), partitioning='hive')`, or any fsspec
filesystem.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime as _dt
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import stat
import tarfile
import threading
import time
import uuid
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.version import __version__

from pipeline import schema

from pipeline import store
from pipeline.kineto import is_trace_name
from pipeline.errors import DatasetError, OutputError, TracepipeError, UsageError
from pipeline.read.limits import inflate_limit, not_regular, too_inflated

TABLES = schema.TABLES
MANIFEST = "traces"
PART = "part-0.parquet"
KEY = "trace_id"
STAGING = "_staging"
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
ENGINES = ("local", "ray", "dask")
FAULT_KILL = "TRACEPIPE_FAULT_KILL"  # tests: a worker given an input whose name holds this value dies

MANIFEST_SCHEMA = pa.schema([
    ("path", pa.string()),              # the input as given; archive members as ARCHIVE!MEMBER
    ("size", pa.int64()),               # bytes of the input file
    ("content_hash", pa.string()),      # BLAKE2b-256 of the file's bytes (hex)
    ("status", pa.string()),            # ok | truncated | quarantined
    ("error", pa.string()),             # why quarantined, or how it was truncated
    ("n_events", pa.int64()),
    ("n_gpu_ops", pa.int64()),
    ("n_flows", pa.int64()),
    ("n_devices", pa.int64()),
    ("trace_start_ns", pa.int64()),     # earliest event ts in the trace
    ("trace_end_ns", pa.int64()),       # latest event end (ts + dur) in the trace
    ("started_at", pa.timestamp("ms", tz="UTC")),   # when flattening this input started
    ("finished_at", pa.timestamp("ms", tz="UTC")),  # ... and ended
    ("warnings", pa.string()),
    ("tracepipe_version", pa.string()),
])


# ------------------------------------------------------------------ inputs
@dataclass
class Item:
    """One input: a local file to flatten (`path`) and the name it is reported by (`source`)."""

    source: str
    path: str | None = None
    size: int = 0
    content_hash: str | None = None
    rejected: str | None = None  # an archive member refused before reading (unsafe name, a link)
    failed: str | None = None    # not readable, through no fault of its content: nothing committed
    temp: bool = False           # path is an extracted copy to delete once used

    @property
    def trace_id(self) -> str:
        if self.content_hash is None:  # rejected unread: never the id of real content
            return "t" + hashlib.blake2b(f"rejected:{self.source}".encode(), digest_size=8).hexdigest()
        return "t" + self.content_hash[:16]


class _Hasher:
    def __init__(self):
        self.h, self.size = hashlib.blake2b(digest_size=32), 0

    def update(self, b: bytes):
        self.h.update(b)
        self.size += len(b)


def file_hash(path: str) -> tuple[str, int]:
    """BLAKE2b-256 hex digest and size of a file, read in 1 MiB blocks."""
    h = _Hasher()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.h.hexdigest(), h.size


def _file_item(path: str) -> Item:
    """A file input, hashed. One that cannot be read for good (a FIFO, no permission) is
    quarantined with the reason; one that vanished fails (retried by the next run)."""
    why = not_regular(path)
    if why == "no such file":
        return Item(source=path, failed=why)
    if why:
        return Item(source=path, rejected=why)
    try:
        digest, size = file_hash(path)
    except OSError as e:
        return Item(source=path, rejected=f"cannot read: {e.strerror or e}")
    return Item(source=path, path=path, size=size, content_hash=digest)


def unsafe_member(name: str) -> str | None:
    """Why an archive member name may not be used, or None."""
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or (p.parts and p.parts[0].endswith(":")):
        return "absolute path in archive"
    if ".." in p.parts:
        return "'..' in archive member path"
    if not p.name or p.name in (".", ".."):
        return "empty archive member name"
    return None


class _TooInflated(Exception):
    pass


def _extract(stream, source: str, name: str, tmp: Path, n: int, limit: int | None, compressed: int) -> Item:
    """Copy one member's bytes into tmp/<n>/<basename>, hashing them on the way; a member that
    inflates past `limit` bytes is removed again and quarantined (a decompression bomb)."""
    d = tmp / str(n)
    d.mkdir(parents=True)
    dst = d / PurePosixPath(name.replace("\\", "/")).name
    h = _Hasher()
    try:
        with open(dst, "wb") as out:
            while b := stream.read(1 << 20):
                h.update(b)
                if limit is not None and h.size > limit:
                    raise _TooInflated()
                out.write(b)
    except _TooInflated:
        shutil.rmtree(d, ignore_errors=True)
        return Item(source=source, rejected=f"archive member {too_inflated(limit, compressed)}")
    return Item(source=source, path=str(dst), size=h.size, content_hash=h.h.hexdigest(), temp=True)


def _tar_items(path: str, tmp: Path, ratio: float | None) -> Iterator[Item]:
    """Members of a tar archive, streamed: one member on disk at a time per pending task. A
    member may inflate to `inflate_limit` of the whole archive's size."""
    try:
        tf = tarfile.open(path, mode="r|*")
    except (tarfile.TarError, OSError) as e:
        raise UsageError(f"{path}: cannot read archive: {e}") from None
    limit = inflate_limit(_size(path), ratio)
    with tf:
        n = 0
        try:
            for m in tf:
                if m.isdir() or not is_trace_name(m.name):
                    continue
                src = f"{path}!{m.name}"
                why = unsafe_member(m.name) or (None if m.isfile() else "archive member is a link or device")
                if why is None and limit is not None and m.size > limit:
                    why = f"archive member of {m.size:,} bytes {too_inflated(limit, _size(path))}"
                if why:
                    yield Item(source=src, rejected=why)
                    continue
                n += 1
                yield _extract(tf.extractfile(m), src, m.name, tmp, n, limit, _size(path))
        except (tarfile.TarError, OSError, EOFError, ValueError) as e:
            yield Item(source=path, failed=f"archive unreadable after {n} members: {e}")


def _zip_items(path: str, tmp: Path, ratio: float | None) -> Iterator[Item]:
    """Members of a zip archive; each may inflate to `inflate_limit` of its compressed size (its
    declared size is checked first, and the bytes as they come: a header may lie)."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{path}: cannot read archive: {e}") from None
    with zf:
        for n, info in enumerate(zf.infolist(), 1):
            if info.is_dir() or not is_trace_name(info.filename):
                continue
            src = f"{path}!{info.filename}"
            mode = info.external_attr >> 16
            limit = inflate_limit(info.compress_size, ratio)
            why = unsafe_member(info.filename) or (
                "archive member is a link or device" if stat.S_IFMT(mode) not in (0, stat.S_IFREG) else None)
            if why is None and limit is not None and info.file_size > limit:
                why = f"archive member of {info.file_size:,} bytes {too_inflated(limit, info.compress_size)}"
            if why:
                yield Item(source=src, rejected=why)
                continue
            try:
                with zf.open(info) as stream:
                    yield _extract(stream, src, info.filename, tmp, n, limit, info.compress_size)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
                yield Item(source=src, rejected=f"archive member unreadable: {e}")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _dir_items(root: str, skip: Path) -> Iterator[Item]:
    """Trace files under root (not inside the dataset), largest first: workers finish together."""
    skip, found = skip.resolve(), []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if Path(d, x).resolve() != skip)
        found += [os.path.join(d, f) for f in sorted(files) if is_trace_name(f)]
    for p in sorted(found, key=_size, reverse=True):
        yield _file_item(p)


def _list_items(listing: str) -> Iterator[Item]:
    try:
        lines = Path(listing).read_text().splitlines()
    except (UnicodeDecodeError, OSError):
        raise UsageError(f"{listing}: not a directory, an archive (.tar, .tar.gz, .tgz, .zip), "
                         "a trace or a text file listing traces") from None
    base = os.path.dirname(listing)
    for line in lines:
        p = line.strip()
        if not p or p.startswith("#"):
            continue
        if not os.path.isabs(p) and not os.path.exists(p) and os.path.exists(os.path.join(base, p)):
            p = os.path.join(base, p)  # relative to the current directory, else to the list file
        yield _file_item(p)


def inputs(src: str | os.PathLike, tmp: Path, dataset: Path, max_inflate: float | None = None) -> Iterator[Item]:
    """Every input of SRC: a directory (recursive), an archive, a trace, or a list of paths.
    `max_inflate`: the ratio archive members may inflate by (`pipeline.limits`)."""
    src = str(src)
    if os.path.isdir(src):
        return _dir_items(src, dataset)
    if not os.path.isfile(src):
        raise UsageError(f"{src}: no such file or directory")
    low = src.lower()
    if is_trace_name(low):
        return iter([_file_item(src)])
    if low.endswith(".zip") or (not low.endswith(TAR_SUFFIXES) and zipfile.is_zipfile(src)):
        return _zip_items(src, tmp, max_inflate)
    if low.endswith(TAR_SUFFIXES) or tarfile.is_tarfile(src):
        return _tar_items(src, tmp, max_inflate)
    return _list_items(src)


# ------------------------------------------------------------------ per-trace work (runs in workers)
def _now():
    return _dt.datetime.now(_dt.timezone.utc)


def _span(events: Path) -> tuple[int | None, int | None]:
    """Earliest ts and latest ts + dur of a trace's events, streaming row groups."""
    import pyarrow.compute as pc

    lo = hi = None
    for b in pq.ParquetFile(events).iter_batches(columns=["ts_ns", "dur_ns"], batch_size=1 << 18):
        ts = b.column(0)
        end = pc.add(ts, pc.fill_null(b.column(1), 0))
        mn, mx = pc.min(ts).as_py(), pc.max(end).as_py()
        lo = mn if lo is None or (mn is not None and mn < lo) else lo
        hi = mx if hi is None or (mx is not None and mx > hi) else hi
    return lo, hi


def process_one(path: str, source: str, trace_id: str, stage: str, max_inflate: float | None = None) -> dict:
    """Flatten one trace into STAGE/<table>/trace_id=<id>/part-0.parquet; return its manifest facts.

    A file that is not a readable trace yields status `quarantined`; other exceptions propagate.
    """
    from pipeline.flatten import flatten

    if (doomed := os.environ.get(FAULT_KILL)) and doomed in source:  # fault injection, for tests
        os.kill(os.getpid(), signal.SIGKILL)
    started = _now()
    stage = Path(stage)
    try:
        r = flatten(path, stage / "flat", workers=1, max_inflate=max_inflate)
    except OutputError:
        raise  # a full disk: not the file's fault, retried by the next run
    except TracepipeError as e:
        msg = str(e).replace(path, source)
        msg = msg[len(source) + 2:] if msg.startswith(f"{source}: ") else msg
        return {"status": "quarantined", "error": msg, "started_at": started, "finished_at": _now()}
    for name in TABLES:
        part = stage / name / f"{KEY}={trace_id}"
        part.mkdir(parents=True)
        if name == "trace":  # the dataset's trace_id lives in the path; record the input's name
            t = pq.read_table(r.out_dir / "trace.parquet")
            t = t.drop_columns([KEY])
            t = t.set_column(t.schema.get_field_index("source_path"), "source_path",
                             pa.array([source] * t.num_rows, pa.string()))
            pq.write_table(t, part / PART, **store.PARQUET_OPTIONS)
        else:
            os.rename(r.out_dir / f"{name}.parquet", part / PART)
    start_ns, end_ns = _span(stage / "events" / f"{KEY}={trace_id}" / PART)
    shutil.rmtree(stage / "flat", ignore_errors=True)
    return {"status": "truncated" if r.truncated else "ok", "error": r.truncation_reason if r.truncated else None,
            "n_events": r.n_events, "n_gpu_ops": r.n_gpu_ops, "n_flows": r.n_flows, "n_devices": r.n_devices,
            "trace_start_ns": start_ns, "trace_end_ns": end_ns, "started_at": started, "finished_at": _now(),
            "warnings": "; ".join(r.warnings) or None}


# ------------------------------------------------------------------ dataset: lock, recovery, commit
@contextmanager
def _locked(ds: Path):
    fd = os.open(ds / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DatasetError(f"{ds}: another `tracepipe batch` is writing this dataset") from None
        yield
    finally:
        os.close(fd)


def committed_ids(ds: Path) -> set[str]:
    """Ids whose manifest row exists: exactly the traces that are in the dataset."""
    d = ds / MANIFEST
    if not d.is_dir():
        return set()
    return {p.name.split("=", 1)[1] for p in d.iterdir()
            if p.name.startswith(f"{KEY}=") and (p / PART).is_file()}


def recover(ds: Path) -> set[str]:
    """Remove what an interrupted run left: staging, and partitions without a manifest row."""
    shutil.rmtree(ds / STAGING, ignore_errors=True)
    keep = committed_ids(ds)
    for name in (*TABLES, MANIFEST):
        d = ds / name
        if d.is_dir():
            for p in d.iterdir():
                if p.name.startswith(f"{KEY}=") and p.name.split("=", 1)[1] not in keep:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
    return keep


def read_manifest(ds: Path) -> dict[str, dict]:
    """trace_id -> {path, status, error} of every committed manifest row."""
    if not committed_ids(ds):
        return {}
    import pyarrow.dataset as pads

    t = pads.dataset(ds / MANIFEST, format="parquet", partitioning="hive").to_table(
        columns=[KEY, "path", "status", "error"])
    return {r[KEY]: r for r in t.to_pylist()}


def commit(ds: Path, stage: Path, item: Item, facts: dict):
    """Move a staged trace's partitions into the dataset, then its manifest row (last)."""
    part = f"{KEY}={item.trace_id}"
    if facts["status"] != "quarantined":
        for name in TABLES:
            dst = ds / name / part
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists():  # an orphan of a run killed mid-commit (no manifest row): replace it
                shutil.rmtree(dst)
            os.rename(stage / name / part, dst)
    row = {"path": item.source, "size": item.size, "content_hash": item.content_hash,
           "tracepipe_version": __version__, **facts}
    mdir = stage / MANIFEST / part
    mdir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row], schema=MANIFEST_SCHEMA), mdir / PART)
    (ds / MANIFEST).mkdir(exist_ok=True)
    os.rename(mdir, ds / MANIFEST / part)
    shutil.rmtree(stage, ignore_errors=True)


def uncommit(ds: Path, trace_id: str):
    """Take back what a failed commit moved into the dataset (partitions without a manifest row)."""
    part = f"{KEY}={trace_id}"
    if (ds / MANIFEST / part / PART).is_file():
        return  # committed after all
    for name in TABLES:
        shutil.rmtree(ds / name / part, ignore_errors=True)


# ------------------------------------------------------------------ engines
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a killed driver not yet reaped is a zombie: gone too
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return not os.path.isdir("/proc/self") and _signalable(pid)
    except OSError:
        return True


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True


def _watch_driver(pid: int):
    """Worker initializer: exit once the driver is gone (after kill -9 nobody would take our result)."""
    def watch():
        while _alive(pid):
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class _RayExecutor:
    def __init__(self, jobs: int):
        import ray

        if not ray.is_initialized():
            ray.init(**({} if os.environ.get("RAY_ADDRESS") else {"num_cpus": jobs}),
                     include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        self.ray, self._fns = ray, {}

    def submit(self, fn, *args) -> cf.Future:
        remote = self._fns.setdefault(fn, self.ray.remote(fn))
        return remote.remote(*args).future()

    def shutdown(self, wait=True, cancel_futures=False):
        self.ray.shutdown()


class _DaskExecutor:
    def __init__(self, jobs: int):
        import dask
        from dask.distributed import Client, LocalCluster

        addr = dask.config.get("scheduler-address", None)
        self.client = Client(addr) if addr else Client(LocalCluster(n_workers=jobs, threads_per_worker=1,
                                                                    processes=True, dashboard_address=None))
        self.ex = self.client.get_executor(pure=False)

    def submit(self, fn, *args) -> cf.Future:
        return self.ex.submit(fn, *args)

    def shutdown(self, wait=True, cancel_futures=False):
        self.ex.shutdown(wait=wait)
        cluster = self.client.cluster
        self.client.close()
        if cluster is not None:
            cluster.close()


def _check_engine(engine: str):
    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    mod = {"ray": "ray", "dask": "dask.distributed"}.get(engine)
    if mod:
        try:
            __import__(mod)
        except ImportError:
            raise UsageError(f"--engine {engine} needs {engine}: pip install 'tracepipe[{engine}]'") from None


class _Pool:
    """The chosen engine as a concurrent.futures-style executor, started on first use."""

    def __init__(self, engine: str, jobs: int):
        self.engine, self.jobs, self.ex = engine, jobs, None

    def submit(self, fn, *args) -> cf.Future:
        if self.ex is None:
            if self.engine == "ray":
                self.ex = _RayExecutor(self.jobs)
            elif self.engine == "dask":
                self.ex = _DaskExecutor(self.jobs)
            else:
                import multiprocessing as mp

                ctx = mp.get_context("forkserver")  # a fresh process: workers inherit no lock fd
                ctx.set_forkserver_preload(["pipeline.dataset.batch", "pipeline.flatten"])
                self.ex = cf.ProcessPoolExecutor(self.jobs, mp_context=ctx, initializer=_watch_driver,
                                                 initargs=(os.getpid(),))
        try:
            return self.ex.submit(fn, *args)
        except cf.process.BrokenProcessPool:  # a worker died (e.g. out of memory): start afresh
            self.ex.shutdown(wait=False, cancel_futures=True)
            self.ex = None
            return self.submit(fn, *args)

    def close(self):
        if self.ex is not None:
            self.ex.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------ the run
@dataclass
class BatchResult:
    dataset: Path
    added: int = 0          # traces committed by this run (ok or truncated)
    truncated: int = 0      # ... of which salvaged from a truncated file
    quarantined: int = 0    # bad inputs (this run's and those already quarantined)
    skipped: int = 0        # content already in the dataset
    duplicates: int = 0     # same content as another input of this run
    failed: int = 0         # not committed (worker died, internal error): retried next run
    problems: list = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if (self.quarantined or self.truncated or self.failed) else 0


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def run_batch(src: str | os.PathLike, dataset: str | os.PathLike, *, jobs: int | None = None,
              engine: str = "local", report: Callable[[str, str, str], None] | None = None,
              max_inflate: float | None = None) -> BatchResult:
    """Flatten every trace of SRC into DATASET (see the module docstring), skipping known content.

    `report(kind, source, message)` is called as inputs finish; kind is one of ok, truncated,
    quarantined, failed, skipped, duplicate.
    """
    _check_engine(engine)
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError("-j must be at least 1")
    ds = Path(dataset)
    if ds.exists() and not ds.is_dir():
        raise UsageError(f"{ds}: exists and is not a directory")
    ds.mkdir(parents=True, exist_ok=True)
    res = BatchResult(ds)
    say = report or (lambda kind, source, msg: None)

    def note(kind, item, msg=""):
        if kind in ("quarantined", "truncated", "failed"):
            res.problems.append(f"{item.source}: {kind}" + (f": {msg}" if msg else ""))
        say(kind, item.source, msg)

    with _locked(ds):
        recover(ds)
        known = read_manifest(ds)  # what earlier runs committed
        run = ds / STAGING / uuid.uuid4().hex[:12]
        run.mkdir(parents=True)
        pool, pending, seen = _Pool(engine, jobs), {}, set()
        suspects: list = []  # inputs in flight when a worker died: each is run again alone
        alone: set = set()  # the trace ids being run alone

        def settle(item: Item, stage: Path, facts: dict):
            """Commit a trace's outcome; a commit the disk refuses is undone and retried next run."""
            try:
                commit(ds, stage, item, facts)
            except OSError as e:
                uncommit(ds, item.trace_id)
                res.failed += 1
                note("failed", item, f"cannot commit: {e.strerror or e}")
                seen.discard(item.trace_id)
                return
            st = facts["status"]
            res.quarantined += st == "quarantined"
            res.added += st != "quarantined"
            res.truncated += st == "truncated"
            note(st, item, facts.get("error") or "")

        def finish(fut):
            item, stage = pending.pop(fut)
            keep_input = False
            try:
                facts = fut.result()
            except cf.process.BrokenProcessPool:  # a worker died (killed, out of memory): whose input was it?
                if item.trace_id in alone:
                    now = _now()
                    settle(item, stage, {"status": "quarantined", "started_at": now, "finished_at": now,
                                         "error": "the worker flattening it died (killed by a signal: out of memory?)"})
                else:
                    suspects.append((item, stage))
                    keep_input = True
            except Exception as e:  # noqa: BLE001 - not the file's fault: commit nothing, retry next run
                res.failed += 1
                note("failed", item, f"{type(e).__name__}: {e}".splitlines()[0])
                seen.discard(item.trace_id)
            else:
                settle(item, stage, facts)
            finally:
                if item.temp and not keep_input:
                    shutil.rmtree(Path(item.path).parent, ignore_errors=True)

        def submit(item: Item, stage: Path):
            shutil.rmtree(stage, ignore_errors=True)  # what a dead worker may have left
            pending[pool.submit(process_one, item.path, item.source, item.trace_id, str(stage), max_inflate)] = \
                (item, stage)

        try:
            for item in inputs(src, run / "x", ds, max_inflate):
                if item.failed:
                    res.failed += 1
                    note("failed", item, item.failed)
                    continue
                tid = item.trace_id
                if tid in known or tid in seen:
                    old = known.get(tid)
                    if old is not None and old["status"] != "ok":
                        res.quarantined += old["status"] == "quarantined"
                        res.truncated += old["status"] == "truncated"
                        note(old["status"], item, f"{old['error']} (already in the dataset)")
                    elif old is not None:
                        res.skipped += 1
                        say("skipped", item.source, "")
                    else:
                        res.duplicates += 1
                        say("duplicate", item.source, "")
                    if item.temp:
                        shutil.rmtree(Path(item.path).parent, ignore_errors=True)
                    continue
                seen.add(tid)
                stage = run / tid
                if item.rejected:
                    stage.mkdir()
                    now = _now()
                    settle(item, stage, {"status": "quarantined", "error": item.rejected,
                                         "started_at": now, "finished_at": now})
                    continue
                while len(pending) >= 2 * jobs:
                    for f in cf.wait(pending, return_when=cf.FIRST_COMPLETED).done:
                        finish(f)
                submit(item, stage)
            while pending:
                for f in cf.wait(list(pending), return_when=cf.FIRST_COMPLETED).done:
                    finish(f)
            while suspects:  # one at a time: a worker that dies now died of this input
                item, stage = suspects.pop(0)
                alone.add(item.trace_id)
                submit(item, stage)
                for f in cf.wait(list(pending)).done:
                    finish(f)
        finally:
            pool.close()
            shutil.rmtree(run, ignore_errors=True)
            try:
                (ds / STAGING).rmdir()
            except OSError:
                pass
    return res
