"""The local executor: a process pool per CPU stage (decode, transcode), a thread per model stage.

Worker processes are forked from a forkserver, never from the driver: the driver may hold torch's
thread pools and a CUDA context, which a forked child inherits in a broken state. The forkserver is a
fresh single-threaded process started when the run starts; it imports the process stages' modules once
(while the driver builds its models), so each worker then starts in milliseconds instead of paying
Python's start-up and those imports itself (~0.6 s a worker with `spawn`). Stage modules that run in
processes import no torch.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from vidforge.curate.executors.base import Monitor, UnitCallback, WorkerLost, drive
from vidforge.curate.stage import Outcome, RunStats, Stage, StageStats, run_batch

_WORKER_STAGE: Stage | None = None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask: a container's or a job's limit, not the
    machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API on this platform
        return os.cpu_count() or 1


def _init_worker(stage: Stage, driver: int) -> None:
    global _WORKER_STAGE
    watch_parent(driver)
    stage.setup()
    _WORKER_STAGE = stage


def watch_parent(driver: int, every_s: float = 0.5) -> None:
    """Exit this worker once the driver process is gone. A driver killed with SIGKILL runs no clean-up,
    and its workers would otherwise sit blocked on their task queue for minutes (each holding its memory
    and the forkserver's and resource tracker's pipes open, so those stay too)."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent or not process_alive(driver):
                os._exit(1)  # no clean-up to run: the driver that wanted the results is dead

    threading.Thread(target=watch, name="vf-watch-driver", daemon=True).start()


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel (a zombie then counts as alive until reaped)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _work(items: list[Any]) -> list[Outcome]:
    assert _WORKER_STAGE is not None
    return run_batch(_WORKER_STAGE, items)


def _start_forkserver(context, modules: list[str]) -> None:
    """Start the forkserver now (it imports `modules`, and the main script as a spawned child would,
    before its first fork) rather than at the first worker. A server already running, from an earlier
    run in this process, is reused as it is."""
    from multiprocessing import forkserver

    context.set_forkserver_preload(["__main__", *modules])
    forkserver.ensure_running()


class LocalExecutor:
    """Runs stages on this machine. `queue_depth` batches per worker may wait in flight (backpressure)."""

    def __init__(self, queue_depth: int = 2, start_method: str = "forkserver"):
        self.queue_depth = queue_depth
        self.context = multiprocessing.get_context(start_method)
        self._stages: list[Stage] = []
        self._pools: list[Any] = []
        self._modules: list[str] = []

    def run(
        self, stages: list[Stage], units, on_unit: UnitCallback, monitor: Monitor | None = None
    ) -> RunStats:
        return drive(stages, units, on_unit, self, monitor)

    # -- Backend -------------------------------------------------------------------------------------
    def start(self, stages: list[Stage]) -> None:
        # Pools start at their stage's first item: a stage whose items all run in the driver (transcode,
        # when every clip was recorded during analysis) never starts its workers.
        # The forkserver starts now when the first stage has workers (its start-up then overlaps the
        # driver's set-up), else at the first pool a later stage needs, if any does.
        self._stages = stages
        self._pools = [None] * len(stages)
        self._modules = sorted({type(s).__module__ for s in stages if s.kind == "process" and s.workers > 0})
        if stages and stages[0].kind == "process" and stages[0].workers > 0:
            self._ensure_forkserver()

    def _ensure_forkserver(self) -> None:
        if self._modules and self.context.get_start_method() == "forkserver":
            _start_forkserver(self.context, self._modules)
            self._modules = []  # started: once

    def _make_pool(self, stage: Stage):
        if stage.workers == 0:
            return None
        if stage.kind == "thread":
            return ThreadPoolExecutor(max_workers=stage.workers, thread_name_prefix=stage.name)
        self._ensure_forkserver()
        return ProcessPoolExecutor(
            stage.workers, mp_context=self.context, initializer=_init_worker, initargs=(stage, os.getpid())
        )

    def capacity(self, index: int) -> int:
        return max(1, self._stages[index].workers) * self.queue_depth

    def workers(self, index: int) -> int:
        return self._stages[index].workers

    def submit(self, index: int, items: list[Any]) -> Future:
        stage = self._stages[index]
        if self._pools[index] is None:
            self._pools[index] = self._make_pool(stage)
        pool = self._pools[index]
        if pool is None:  # inline: run now, hand back a finished future
            future: Future = Future()
            future.set_result(run_batch(stage, items))
            return future
        if stage.kind == "thread":
            return pool.submit(run_batch, stage, items)
        try:
            return pool.submit(_work, items)
        except BrokenProcessPool:
            self._restart(index)
            return self._pools[index].submit(_work, items)

    def wait(self, handles: list[Future], timeout: float) -> list[Future]:
        done, _ = wait(handles, timeout=timeout, return_when=FIRST_COMPLETED)
        return list(done)

    def outcomes(self, handle: Future) -> list[Outcome]:
        try:
            return handle.result()
        except BrokenProcessPool as err:
            for index, pool in enumerate(self._pools):
                if isinstance(pool, ProcessPoolExecutor) and getattr(pool, "_broken", False):
                    self._restart(index)
            raise WorkerLost(str(err) or "a worker process terminated abruptly") from None

    def _restart(self, index: int) -> None:
        self._pools[index].shutdown(wait=False, cancel_futures=True)
        self._pools[index] = self._make_pool(self._stages[index])

    def rebalance(self, stats: list[StageStats]) -> None:
        """Fixed pools: the profile sets the workers per stage."""

    def stop(self, abort: bool = False) -> None:
        for pool in self._pools:
            if isinstance(pool, ProcessPoolExecutor) and abort:
                _terminate_workers(pool)
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pools = []


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's workers mid-item, so shutting it down does not wait for their items to finish. What
    they leave half-written carries the temporary mark and is cleaned by the next run."""
    if hasattr(pool, "terminate_workers"):  # Python 3.14+
        pool.terminate_workers()
        return
    for process in list((pool._processes or {}).values()):  # noqa: SLF001 - no public API before 3.14
        process.terminate()
