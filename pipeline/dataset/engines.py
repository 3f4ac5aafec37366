"""engines: where a batch's traces are flattened: local worker processes, a Ray cluster or a
Dask scheduler, each behind one concurrent.futures-style interface (`Pool`)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time

from pipeline.errors import UsageError

ENGINES = ("local", "ray", "dask")


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
            ray.init(
                **({} if os.environ.get("RAY_ADDRESS") else {"num_cpus": jobs}),
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
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
            raise UsageError(f"--engine {engine} needs {engine}: pip install 'tracepipe[{engine}]'") from None


class Pool:
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
                self.ex = cf.ProcessPoolExecutor(
                    self.jobs, mp_context=ctx, initializer=_watch_driver, initargs=(os.getpid(),)
                )
        try:
            return self.ex.submit(fn, *args)
        except cf.process.BrokenProcessPool:  # a worker died (e.g. out of memory): start afresh
            self.ex.shutdown(wait=False, cancel_futures=True)
            self.ex = None
            return self.submit(fn, *args)

    def close(self):
        if self.ex is not None:
            self.ex.shutdown(wait=True, cancel_futures=True)
