"""batch: many traces -> one dataset (`layout`), incrementally and crash-safely.

Each input (`inputs`) whose content is not in the dataset yet is flattened by a worker (`engines`)
into staging and committed (`layout.commit`); bad inputs are committed as quarantined manifest rows
with their reason (re-runs report them without reading them again); a failure that is not the
file's fault (a full disk, a bug) commits nothing and is retried by the next run; a worker that
dies has its inputs run again one at a time, and the one that kills its worker is quarantined.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import datetime as _dt
import os
import shutil
import signal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import store
from pipeline.dataset.engines import Pool, check_engine
from pipeline.dataset.inputs import Item, inputs
from pipeline.dataset.layout import KEY, PART, STAGING, TABLES, commit, locked, read_manifest, recover, uncommit
from pipeline.errors import OutputError, TracepipeError, UsageError

FAULT_KILL = "TRACEPIPE_FAULT_KILL"  # tests: a worker given an input whose name holds this value dies


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
        msg = msg[len(source) + 2 :] if msg.startswith(f"{source}: ") else msg
        return {"status": "quarantined", "error": msg, "started_at": started, "finished_at": _now()}
    for name in TABLES:
        part = stage / name / f"{KEY}={trace_id}"
        part.mkdir(parents=True)
        if name == "trace":  # the dataset's trace_id lives in the path; record the input's name
            t = pq.read_table(r.out_dir / "trace.parquet")
            t = t.drop_columns([KEY])
            t = t.set_column(
                t.schema.get_field_index("source_path"), "source_path", pa.array([source] * t.num_rows, pa.string())
            )
            pq.write_table(t, part / PART, **store.PARQUET_OPTIONS)
        else:
            os.rename(r.out_dir / f"{name}.parquet", part / PART)
    start_ns, end_ns = _span(stage / "events" / f"{KEY}={trace_id}" / PART)
    shutil.rmtree(stage / "flat", ignore_errors=True)
    return {
        "status": "truncated" if r.truncated else "ok",
        "error": r.truncation_reason if r.truncated else None,
        "n_events": r.n_events,
        "n_gpu_ops": r.n_gpu_ops,
        "n_flows": r.n_flows,
        "n_devices": r.n_devices,
        "trace_start_ns": start_ns,
        "trace_end_ns": end_ns,
        "started_at": started,
        "finished_at": _now(),
        "warnings": "; ".join(r.warnings) or None,
    }


@dataclass
class BatchResult:
    dataset: Path
    added: int = 0  # traces committed by this run (ok or truncated)
    truncated: int = 0  # ... of which salvaged from a truncated file
    quarantined: int = 0  # bad inputs (this run's and those already quarantined)
    skipped: int = 0  # content already in the dataset
    duplicates: int = 0  # same content as another input of this run
    failed: int = 0  # not committed (worker died, internal error): retried next run
    problems: list = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if (self.quarantined or self.truncated or self.failed) else 0


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def run_batch(
    src: str | os.PathLike,
    dataset: str | os.PathLike,
    *,
    jobs: int | None = None,
    engine: str = "local",
    report: Callable[[str, str, str], None] | None = None,
    max_inflate: float | None = None,
) -> BatchResult:
    """Flatten every trace of SRC into DATASET (see the module docstring), skipping known content.

    `report(kind, source, message)` is called as inputs finish; kind is one of ok, truncated,
    quarantined, failed, skipped, duplicate.
    """
    check_engine(engine)
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

    with locked(ds):
        recover(ds)
        known = read_manifest(ds)  # what earlier runs committed
        run = ds / STAGING / uuid.uuid4().hex[:12]
        run.mkdir(parents=True)
        pool, pending, seen = Pool(engine, jobs), {}, set()
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
                    settle(
                        item,
                        stage,
                        {
                            "status": "quarantined",
                            "started_at": now,
                            "finished_at": now,
                            "error": "the worker flattening it died (killed by a signal: out of memory?)",
                        },
                    )
                else:
                    suspects.append((item, stage))
                    keep_input = True
            except Exception as e:
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
            pending[pool.submit(process_one, item.path, item.source, item.trace_id, str(stage), max_inflate)] = (
                item,
                stage,
            )

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
                    settle(
                        item,
                        stage,
                        {"status": "quarantined", "error": item.rejected, "started_at": now, "finished_at": now},
                    )
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
            with contextlib.suppress(OSError):
                (ds / STAGING).rmdir()
    return res
