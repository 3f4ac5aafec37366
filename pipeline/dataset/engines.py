"""engines: where a batch's traces are flattened: local worker processes, a Ray cluster or a
Dask scheduler, each behind one concurrent.futures-style interface (`Pool`)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from pipeline.errors import UsageError

ENGINES = ("local", "ray", "dask")
# imported once by the forkserver that the local workers fork from: no worker imports them again
PRELOAD = [
    "pipeline.dataset.batch",
    "pipeline.dataset.group",
    "pipeline.flatten",
    "pipeline.read.decode",
    "pipeline.link.links",
    "pipeline.cost.enrich",
    "pipeline.runs.tables",
    "pipeline.runs.steps",
    "pipeline.cost.categories",
    "pipeline.cost.devices",
    "pipeline.read.metadata",
]


def prestart(argv: list[str]) -> None:
    """For a `batch` command line (`argv` after the command) that will use local workers: start
    their forkserver now, before the command's own imports. It imports PRELOAD (~0.45 s) on the
    other core while this process imports the CLI (~0.3 s): they went one after the other, at
    the start of every batch (2,000 small traces: 4.2 s). `Pool` then finds it running."""
    if any(a in ("-h", "--help") for a in argv) or _engine_named(argv) not in (None, "local"):
        return
    from multiprocessing import forkserver

    _forkserver()
    forkserver.ensure_running()


SUN_PATH = 107  # bytes of an AF_UNIX socket's path (108 with its NUL on Linux; 104 on macOS)


def _short_socket_dir() -> None:
    """Python before 3.13 puts the forkserver's socket in a folder under TMPDIR
    (`TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX`): a TMPDIR of ~80 characters made every `batch` a
    traceback, "OSError: AF_UNIX path too long". Then the folder goes under /tmp, as Python 3.13
    does; multiprocessing removes it at exit as its own. Private API: a failure leaves it as it was."""
    import shutil
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config  # type: ignore[attr-defined]
    if config.get("tempdir") or len(os.fsencode(tempfile.gettempdir())) + 34 <= SUN_PATH - 4:
        return
    try:
        short = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    except OSError:
        return
    util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
    config["tempdir"] = short


def _forkserver():
    """The context the local workers start in: forked by a forkserver (a fresh process: workers
    inherit no lock fd) that has imported PRELOAD."""
    import multiprocessing as mp

    _short_socket_dir()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _engine_named(argv: list[str]) -> str | None:
    """The value of the last --engine option of a command line, if any."""
    named = None
    for i, a in enumerate(argv):
        if a == "--engine" and i + 1 < len(argv):
            named = argv[i + 1]
        elif a.startswith("--engine="):
            named = a.split("=", 1)[1]
    return named


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
            cpus: dict[str, Any] = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": jobs}
            ray.init(
                **cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
        self.ray = ray
        self._fns: dict[Callable, Any] = {}  # fn -> its Ray remote function

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
        self.client = (
            Client(addr)
            if addr
            else Client(LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, dashboard_address=None))
        )
        self.ex = self.client.get_executor(pure=False)

    def submit(self, fn, *args) -> cf.Future:
        return self.ex.submit(fn, *args)

    def shutdown(self, wait=True, cancel_futures=False):
        self.ex.shutdown(wait=wait)
        cluster = self.client.cluster
        self.client.close()
        if cluster is not None:
            cluster.close()


def check_engine(engine: str):
    if engine not in ENGINES:
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    mod = {"ray": "ray", "dask": "dask.distributed"}.get(engine)
    if mod:
        try:
            __import__(mod)
        except ImportError:
            raise UsageError(f"--engine {engine} needs {engine}: pip install -e '.[{engine}]' in a clone") from None


def _nothing():
    return None


def _warm(ex: cf.ProcessPoolExecutor, jobs: int) -> None:
    """Start `jobs` workers by giving them nothing to do; quietly stop if the pool is already
    shut down (a batch that found nothing to do can finish before this thread runs)."""
    try:
        for _ in range(jobs):
            ex.submit(_nothing)
    except (RuntimeError, cf.process.BrokenProcessPool):
        pass


class Pool:
    """The chosen engine as a concurrent.futures-style executor, started on first use."""

    def __init__(self, engine: str, jobs: int):
        self.engine, self.jobs = engine, jobs
        self.ex: _RayExecutor | _DaskExecutor | cf.ProcessPoolExecutor | None = None

    def start(self):
        """Start the local workers now, in the background (the forkserver imports tracepipe, then
        forks them) while the caller goes on."""
        if self.ex is None and self.engine == "local":
            self._executor()
            ex = self.ex
            assert isinstance(ex, cf.ProcessPoolExecutor)
            threading.Thread(target=_warm, args=(ex, self.jobs), daemon=True).start()

    def submit(self, fn, *args) -> cf.Future:
        self._executor()
        assert self.ex is not None
        try:
            return self.ex.submit(fn, *args)
        except cf.process.BrokenProcessPool:  # a worker died (e.g. out of memory): start afresh
            self.ex.shutdown(wait=False, cancel_futures=True)
            self.ex = None
            return self.submit(fn, *args)

    def _executor(self):
        if self.ex is None:
            if self.engine == "ray":
                self.ex = _RayExecutor(self.jobs)
            elif self.engine == "dask":
                self.ex = _DaskExecutor(self.jobs)
            else:
                self.ex = cf.ProcessPoolExecutor(
                    self.jobs, mp_context=_forkserver(), initializer=_watch_driver, initargs=(os.getpid(),)
                )

    def close(self):
        """Stop the workers; local ones exit in the background (the caller has nothing pending)."""
        if self.ex is not None:
            self.ex.shutdown(wait=self.engine != "local", cancel_futures=True)
            if self.engine == "local":  # the forkserver holds its preloaded modules: stop it too
                from pipeline.read.workers import stop_forkserver

                stop_forkserver()
