"""events: the few events of a trace that a whole-run answer needs, kept from one streaming pass.

Each chunk of traceEvents text is decoded by msgspec into small structs (`Event`: ph, cat, name,
pid, tid and the raw text of ts, dur and args, nothing else); an event is looked at by its
category (one dict lookup per event, cached per category and name), and only these are kept:

- GPU kernels: start, end, device and whether they are communication (`comms.COMM_KERNEL`) as
  numbers (the steps' compute and communication), and, for those of a collective library
  (`comms.NCCL_KERNEL`), their name and args;
- launches (cuda/hip runtime): correlation -> thread and start, to find the CPU ops around a
  collective kernel's launch;
- communication CPU ops and annotations (`comms.COMM_OP`, `comms.GLOO_WORK`): name, thread, span, args;
- `ProfilerStep#N` annotations; thread names (gloo's runloop threads, HCCL's group lanes);
- events without a cat that their args tell apart (torch_npu): device tasks (`kineto.DEVICE_TASKS`,
  kept as kernels, their device read from the pid once the processes' sort indexes are known),
  HCCL collectives and the tasks of their planes (`comms.HCCL_OP_ARGS`, `comms.HCCL_TASK_ARGS`).

Times become int64 ns exactly as `flatten` makes them (`read.values.us_to_ns`): below
FLOAT_EXACT_US from the float, above it from the decimal text, never through a float.
"""

from __future__ import annotations

import re
from array import array
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

import msgspec
import orjson

from pipeline.comms import (
    COMM_KERNEL,
    COMM_OP,
    GLOO_WORK,
    HCCL_OP_ARGS,
    HCCL_TASK_ARGS,
    HCCL_TASK_LINK,
    HCCL_TASK_SIZE,
    NCCL_KERNEL,
)
from pipeline.kineto import (
    ANNOTATION_CATS,
    CPU_OP_CATS,
    DEVICE_TASKS,
    GPU_KINDS,
    LAUNCH_CATS,
    STEP_CATS,
    STEP_NAME,
    task_device,
    task_kind,
)
from pipeline.read.values import FLOAT_EXACT_US

EMPTY = msgspec.Raw(b"")


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = EMPTY
    dur: msgspec.Raw = EMPTY
    args: msgspec.Raw = EMPTY


DECODER = msgspec.json.Decoder(list[Event])
KERNEL, LAUNCH, OP, ANNOTATION = 1, 2, 3, 4
_IS_NCCL, _IS_COMM, _IS_COMM_OP, _IS_GLOO, _IS_STEP = (
    re.compile(p) for p in (NCCL_KERNEL, COMM_KERNEL, COMM_OP, GLOO_WORK, STEP_NAME)
)


def _class_of(cat: Any) -> int:
    if not isinstance(cat, str):
        return 0
    if GPU_KINDS.get(cat) == "kernel":
        return KERNEL
    low = cat.lower()
    if low in LAUNCH_CATS:
        return LAUNCH
    if low in CPU_OP_CATS:
        return OP
    if low in ANNOTATION_CATS:
        return ANNOTATION
    return 0


def us_to_ns(raw) -> int | None:
    """µs text (a JSON number, or a number in a string) as int64 ns, as `flatten` turns it: below
    FLOAT_EXACT_US from the float, above it from the decimal digits (rounded half to even)."""
    t = bytes(raw)
    if not t or t == b"null":
        return None
    if t[:1] == b'"':
        t = t[1:-1].strip()
    try:
        whole, dot, frac = t.partition(b".")
        if b"e" in t or b"E" in t:
            return _ns_of_float(t)
        if not dot:
            return int(t) * 1000
        if abs(int(whole or b"0")) < FLOAT_EXACT_US:
            return round(float(t) * 1000)
        neg = whole.startswith(b"-")
        ns = abs(int(whole)) * 1000 + int(frac[:3].ljust(3, b"0"))
        rest = frac[3:].rstrip(b"0")
        if rest and (rest[:1] > b"5" or (rest[:1] == b"5" and (len(rest) > 1 or ns & 1))):
            ns += 1
        return -ns if neg else ns
    except (ValueError, InvalidOperation, OverflowError):
        return None


def _ns_of_float(t: bytes) -> int | None:
    v = float(t)
    if -FLOAT_EXACT_US < v < FLOAT_EXACT_US:
        return round(v * 1000)
    return int((Decimal(t.decode()) * 1000).to_integral_value())


_MARKS = lambda keys: tuple(f'"{k}":'.encode() for k in keys)
_TASKS = tuple((_MARKS(t.marks), _MARKS(t.stream_args), t.task_type_arg) for t in DEVICE_TASKS)
_HCCL_OP, _HCCL_TASK = _MARKS(HCCL_OP_ARGS), _MARKS(HCCL_TASK_ARGS)
_CORRELATION = re.compile(rb'"correlation"\s*:\s*(\d+)')
_DEVICE = re.compile(rb'"device"\s*:\s*(\d+)')


def _args(raw) -> dict:
    if not raw:
        return {}
    try:
        a = orjson.loads(memoryview(raw))
    except orjson.JSONDecodeError:
        return {}
    return a if type(a) is dict else {}


def _thread(v: Any) -> int | str | None:
    return v if type(v) in (int, str) else None


class Kept:
    """What one trace's pass keeps (see the module docstring). Kernels' numbers are packed in
    arrays (8 bytes a value): a trace of millions of kernels keeps tens of MB."""

    def __init__(self) -> None:
        self.n_events = 0
        self.k_ts, self.k_end, self.k_dev, self.k_comm = array("q"), array("q"), array("q"), array("b")
        self.comm_kernels: list[dict] = []  # name, ts_ns, dur_ns, device, stream, correlation, args
        self.l_corr, self.l_ts, self.l_thread = array("q"), array("q"), array("q")  # launches
        self.threads: dict[tuple, int] = {}  # (pid, tid) -> its number in l_thread
        self.ops: list[dict] = []  # communication CPU ops and annotations: name, cat, pid, tid, ts_ns, end_ns, args
        self.steps: list[tuple] = []  # (name, ts_ns, end_ns)
        self.thread_names: list[tuple] = []  # (pid, tid, name)
        self.task_pids: dict[int, list[int]] = {}  # pid -> the kernels (k_*) that are its device tasks
        self.sort_index: dict = {}  # pid -> its process_sort_index
        self.hccl_ops: list[dict] = []  # name, pid, tid, ts_ns, dur_ns, args
        self.hccl_tasks: list[tuple] = []  # (pid, tid, ts_ns, src, dst, size, link)
        self._class: dict = {}
        # the Chrome format's B/E duration events, paired as `read.durations` pairs them: per
        # thread, an E closes the latest B still open there; each open B's slot names the step or
        # op it was kept as (None: not kept), which its E then gives an end
        self._open: dict[tuple, list] = {}
        self._begun: list | None = None  # the slot of the B being looked at

    def add_text(self, text: bytes) -> None:
        """Keep what a chunk of traceEvents text holds (`add_events` for what msgspec refuses)."""
        try:
            events = DECODER.decode(b"[" + text + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError):
            from pipeline.read.chunks import ChunkParseError, parse_chunk_tamed

            try:
                events_any, _ = parse_chunk_tamed(text)
            except ChunkParseError:
                raise
            self.add_events(events_any)
            return
        self._add(events)

    def add_events(self, events: list) -> None:
        """Keep what parsed events (dicts: a salvaged tail, or a chunk msgspec refused) hold."""
        out = []
        for e in events:
            if type(e) is not dict:
                continue
            out.append(
                Event(
                    e.get("ph"),
                    e.get("cat"),
                    e.get("name"),
                    e.get("pid"),
                    e.get("tid"),
                    *(msgspec.Raw(orjson.dumps(e[k], default=str)) if k in e else EMPTY for k in ("ts", "dur", "args")),
                )
            )
        self._add(out)

    def _add(self, events: list) -> None:
        self.n_events += len(events)
        classes = self._class
        for e in events:
            if e.ph == "E" or e.ph == "B":
                if self._paired(e):
                    continue
            c = classes.get(e.cat)
            if c is None:
                c = classes[e.cat] = _class_of(e.cat)
            if not c:
                if e.ph == "M" and e.name == "thread_name":
                    name = _args(e.args).get("name")
                    self.thread_names.append((_thread(e.pid), _thread(e.tid), name if isinstance(name, str) else ""))
                elif e.ph == "M" and e.name == "process_sort_index":
                    self.sort_index.setdefault(e.pid, _args(e.args).get("sort_index"))
                elif e.ph == "X" and e.cat is None and e.args:
                    self._without_cat(e)
                continue
            if c == KERNEL:
                self._kernel(e)
            elif c == LAUNCH:
                m = _CORRELATION.search(e.args)
                ts = us_to_ns(e.ts) if m else None
                if m is not None and ts is not None:
                    corr = int(m.group(1))
                    key = (_thread(e.pid), _thread(e.tid))
                    n = self.threads.get(key)
                    if n is None:
                        n = self.threads[key] = len(self.threads)
                    self.l_corr.append(corr)
                    self.l_ts.append(ts)
                    self.l_thread.append(n)
            else:
                name = e.name
                if not isinstance(name, str):
                    continue
                kind = _op_kind(e.cat, name)
                if kind == "step":
                    ts = us_to_ns(e.ts)
                    if ts is not None:
                        self.steps.append((name, ts, ts + (us_to_ns(e.dur) or 0)))
                        if e.ph == "B" and self._begun is not None:
                            self._begun.append(("step", len(self.steps) - 1))
                elif kind:
                    ts = us_to_ns(e.ts)
                    if ts is not None:
                        if e.ph == "B" and self._begun is not None:
                            self._begun.append(("op", len(self.ops)))
                        self.ops.append(
                            {
                                "name": name,
                                "cat": c,
                                "pid": _thread(e.pid),
                                "tid": _thread(e.tid),
                                "ts_ns": ts,
                                "end_ns": ts + (us_to_ns(e.dur) or 0),
                                "args": _args(e.args),
                            }
                        )

    def _paired(self, e: Event) -> bool:
        """A B opens a slot on its thread (True: looked at no further; else it is kept as a
        complete event would be, and its slot says as what); an E closes the latest (True)."""
        key = (_thread(e.pid), _thread(e.tid))
        if e.ph == "B":
            self._begun = []
            self._open.setdefault(key, []).append(self._begun)
            return False
        stack = self._open.get(key)
        if not stack:
            return True  # an E without a B open on its thread: nothing to end
        slot = stack.pop()
        end = us_to_ns(e.ts)
        for what, i in slot:
            if what == "step":
                name, ts, _ = self.steps[i]
                if end is not None and end >= ts:
                    self.steps[i] = (name, ts, end)
            elif end is not None and end >= self.ops[i]["ts_ns"]:
                self.ops[i]["end_ns"] = end
        return True

    def _without_cat(self, e: Event) -> None:
        """A complete event without a cat: a device task, an HCCL collective or a task of its planes
        (torch_npu), as its args tell; else nothing to keep."""
        raw = bytes(e.args)
        if all(m in raw for m in _HCCL_OP):
            ts = us_to_ns(e.ts)
            if ts is not None and isinstance(e.name, str):
                self.hccl_ops.append(
                    {"name": e.name, "pid": _thread(e.pid), "tid": _thread(e.tid), "ts_ns": ts,
                     "dur_ns": us_to_ns(e.dur) or 0, "args": _args(e.args)}
                )  # fmt: skip
            return
        if all(m in raw for m in _HCCL_TASK):
            ts = us_to_ns(e.ts)
            a = _args(e.args)
            if ts is not None:
                value = lambda k: a.get(k) if type(a.get(k)) is int else None
                link = a.get(HCCL_TASK_LINK)
                self.hccl_tasks.append(
                    (_thread(e.pid), _thread(e.tid), ts, value(HCCL_TASK_ARGS[0]), value(HCCL_TASK_ARGS[1]),
                     value(HCCL_TASK_SIZE), link if isinstance(link, str) else None)
                )  # fmt: skip
            return
        for marks, streams, type_arg in _TASKS:
            if all(m in raw for m in marks) and any(k in raw for k in streams) and type(e.pid) is int:
                ts = us_to_ns(e.ts)
                if ts is None:
                    return
                name = e.name if isinstance(e.name, str) else ""
                if task_kind(_args(e.args).get(type_arg), name) != "kernel":
                    return  # copies and a stream's event waits: no kernel time
                self.task_pids.setdefault(e.pid, []).append(len(self.k_ts))
                self.k_ts.append(ts)
                self.k_end.append(ts + (us_to_ns(e.dur) or 0))
                self.k_dev.append(-1)  # the pid's device, once the sort indexes are known (`task_devices`)
                self.k_comm.append(1 if _kernel_flags(name)[1] else 0)
                return

    def task_devices(self) -> None:
        """Give the device tasks kept as kernels their device: from the pid, by the scheme the
        process's sort index says (`kineto.task_device`)."""
        for pid, rows in self.task_pids.items():
            index = self.sort_index.get(pid)
            device = task_device(pid, index if type(index) is int else None)
            for i in rows:
                self.k_dev[i] = device
        self.task_pids = {}

    def _kernel(self, e: Event) -> None:
        ts = us_to_ns(e.ts)
        if ts is None:
            return
        dur = us_to_ns(e.dur) or 0
        name = e.name if isinstance(e.name, str) else ""
        comm, communication = _kernel_flags(name)
        if comm:
            a = _args(e.args)
            dev = a.get("device")
            dev = dev if type(dev) is int else -1
        else:
            m = _DEVICE.search(e.args)
            dev = int(m.group(1)) if m else -1
        self.k_ts.append(ts)
        self.k_end.append(ts + dur)
        self.k_dev.append(dev)
        self.k_comm.append(1 if communication else 0)
        if comm:
            stream = a.get("stream")
            corr = a.get("correlation")
            self.comm_kernels.append(
                {
                    "name": name,
                    "ts_ns": ts,
                    "dur_ns": dur,
                    "device": dev if dev >= 0 else None,
                    "stream": stream if type(stream) is int else None,
                    "correlation": corr if type(corr) is int else None,
                    "args": a,
                }
            )

    def launches_of_comm_kernels(self) -> dict[int, tuple]:
        """correlation -> (pid, tid, ts_ns) of the launches of the collective kernels."""
        wanted = {k["correlation"] for k in self.comm_kernels if k["correlation"] is not None}
        if not wanted:
            return {}
        thread = list(self.threads)
        out: dict[int, tuple] = {}
        for i, corr in enumerate(self.l_corr):
            if corr in wanted and corr not in out:
                out[corr] = (*thread[self.l_thread[i]], self.l_ts[i])
        return out


@lru_cache(maxsize=1 << 16)
def _kernel_flags(name: str) -> tuple[bool, bool]:
    """(a collective kernel, a communication kernel): per distinct name, once per process (the
    libraries' regex takes ~45 µs on a long C++ name; a trace repeats a few hundred names)."""
    return bool(_IS_NCCL.search(name)), bool(_IS_COMM.search(name))


@lru_cache(maxsize=1 << 16)
def _op_kind(cat: str, name: str) -> str | None:
    """ "step", "comm" (a communication op or annotation to keep), or "" (neither)."""
    if cat.lower() in STEP_CATS and _IS_STEP.search(name):  # ProfilerStep#N: an annotation (2021: an Operator)
        return "step"
    if _IS_COMM_OP.search(name) or _IS_GLOO.search(name):
        return "comm"
    return ""
