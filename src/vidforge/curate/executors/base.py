"""The driver loop every executor shares. It owns the queues between stages; a Backend owns the workers.

Backpressure: a stage gets new batches only while it has fewer than `capacity` in flight and the next
stage's queue is not full, and new units are admitted only when the first stage has room, so memory is
bounded by the capacities, not by the input size.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from vidforge.curate.stage import Outcome, RunStats, Stage, StageStats, run_batch

UnitCallback = Callable[[str, list[Any], list[dict[str, Any]]], None]
"""Called once per unit when all its items have left the pipeline: (unit key, final items, errors)."""
Monitor = Callable[[list[StageStats]], None]
"""Called after every completed batch with the live per-stage counters (progress bars)."""


class WorkerLost(Exception):
    """A worker died (crashed process, lost actor) with a batch in flight; the batch is retried once."""


class Backend(Protocol):
    def start(self, stages: list[Stage]) -> None: ...
    def capacity(self, index: int) -> int: ...
    def submit(self, index: int, items: list[Any]) -> Any: ...
    def wait(self, handles: list[Any], timeout: float) -> list[Any]: ...
    def outcomes(self, handle: Any) -> list[Outcome]: ...
    def rebalance(self, stats: list[StageStats]) -> None: ...
    def workers(self, index: int) -> int: ...
    def stop(self, abort: bool = False) -> None: ...


@dataclass
class _Envelope:
    unit: str
    payload: Any
    attempts: int = 0


class _Setups:
    """Every stage's set-up in the driver: quick ones at once (their errors raise from `start`),
    `slow_setup` ones (models) in order on a background thread, so the stages before them work meanwhile.
    `ready(i)` says whether stage i may get items; `check()` raises a background set-up's error."""

    def __init__(self, stages: list[Stage]):
        self._stages = stages
        self._slow = [i for i, s in enumerate(stages) if s.slow_setup]
        self._done: set[int] = set()
        self._error: BaseException | None = None
        self._changed = threading.Event()
        # A daemon: an aborted run (Ctrl-C, a failed item) does not wait for a model to finish loading.
        self._thread = threading.Thread(target=self._run_slow, name="stage-setup", daemon=True)

    def start(self) -> None:
        for i, stage in enumerate(self._stages):
            if i not in self._slow:
                stage.setup()
                self._done.add(i)
        self._thread.start()

    def _run_slow(self) -> None:
        try:
            for i in self._slow:
                self._stages[i].setup()
                self._done.add(i)
                self._changed.set()
        except BaseException as err:  # noqa: BLE001 - handed to the driver loop, which raises it
            self._error = err
            self._changed.set()

    def ready(self, index: int) -> bool:
        return index in self._done

    def check(self) -> None:
        """Raise a background set-up's error (the run stops at once, not when an item gets there)."""
        if self._error is not None:
            raise self._error

    def wait(self, timeout: float) -> None:
        """Until a background set-up finishes (or fails), at most `timeout` seconds."""
        self._changed.wait(timeout)
        self._changed.clear()

    def finish(self) -> None:
        """Wait for every set-up: a run whose items never reached a slow stage still learns that its
        set-up failed (a wrong checkpoint), whatever the timing."""
        self._thread.join()
        self.check()

    def teardown(self) -> None:
        for i in sorted(self._done):
            self._stages[i].teardown()


def drive(
    stages: list[Stage],
    units: Iterable[tuple[str, Any]],
    on_unit: UnitCallback,
    backend: Backend,
    monitor: Monitor | None = None,
) -> RunStats:
    """Run `units` ((key, first item) pairs) through `stages` on `backend`; see the module docstring."""
    stats = [StageStats(s.name) for s in stages]
    started = time.perf_counter()
    backend.start(stages)  # first: workers' start-up overlaps the driver's set-up below
    setups, finished = _Setups(stages), False
    try:
        setups.start()
        units_done = _loop(stages, iter(units), on_unit, backend, stats, monitor, setups)
        if monitor is not None:  # the last items' counts: the loop can end before reporting them
            monitor(stats)
        setups.finish()
        finished = True
    finally:
        for i, s in enumerate(stats):
            s.workers = backend.workers(i)
        # A failed run stops its workers mid-item: the error is known, and a source can take minutes.
        backend.stop(abort=not finished)
        setups.teardown()
    return RunStats(stages=stats, units=units_done, wall_seconds=time.perf_counter() - started)


def _loop(stages, units, on_unit, backend, stats, monitor, setups: _Setups) -> int:
    """The scheduling loop; returns how many units completed."""
    last = len(stages) - 1
    pending: list[deque[_Envelope]] = [deque() for _ in stages]
    inflight: dict[Any, tuple[int, list[_Envelope]]] = {}
    per_stage = [0] * len(stages)
    outstanding: dict[str, int] = defaultdict(int)
    results: dict[str, list[Any]] = defaultdict(list)
    errors: dict[str, list[dict[str, Any]]] = defaultdict(list)
    exhausted, units_done = False, 0

    def settle(unit: str, delta: int) -> None:
        nonlocal units_done
        outstanding[unit] += delta
        if outstanding[unit] == 0:
            del outstanding[unit]
            on_unit(unit, results.pop(unit, []), errors.pop(unit, []))
            units_done += 1

    def absorb(i: int, batch: list[_Envelope], outs: list[Outcome]) -> None:
        """Stage i's outcomes for `batch`: errors recorded, results queued for the next stage (or kept)."""
        for env, out in zip(batch, outs, strict=False):
            stats[i].busy_seconds += out.seconds
            stats[i].items_done += 1
            if not out.ok:
                stats[i].errors += 1
                record = {"stage": stages[i].name, "reason": out.reason}
                if out.retry:
                    record["retry"] = True
                label = getattr(env.payload, "label", None)
                if label is not None:
                    record["item"] = label
                errors[env.unit].append(record)
                settle(env.unit, -1)
                continue
            value = out.value
            children = value if isinstance(value, list) else ([] if value is None else [value])
            stats[i].items_out += len(children)
            outstanding[env.unit] += len(children)
            if i == last:
                results[env.unit].extend(children)
                outstanding[env.unit] -= len(children)
            else:
                pending[i + 1].extend(_Envelope(env.unit, c) for c in children)
            settle(env.unit, -1)

    def room_after(i: int) -> bool:
        return i == last or len(pending[i + 1]) < backend.capacity(i + 1) * stages[i + 1].batch_size

    while True:
        setups.check()
        while not exhausted and len(pending[0]) < backend.capacity(0):
            try:
                unit, payload = next(units)
            except StopIteration:
                exhausted = True
                break
            outstanding[unit] += 1
            pending[0].append(_Envelope(unit, payload))
        for i in reversed(range(len(stages))):
            if not setups.ready(i):
                continue  # its model is still loading: items wait in its queue (bounded by room_after)
            while pending[i] and per_stage[i] < backend.capacity(i) and room_after(i):
                batch = [pending[i].popleft() for _ in range(min(stages[i].batch_size, len(pending[i])))]
                stats[i].items_in += len(batch)
                if all(stages[i].runs_in_driver(e.payload) for e in batch):
                    absorb(i, batch, run_batch(stages[i], [e.payload for e in batch]))
                    continue
                inflight[backend.submit(i, [e.payload for e in batch])] = (i, batch)
                per_stage[i] += 1
        if not inflight:
            if exhausted and not any(pending):
                break
            setups.wait(timeout=0.5)  # only a stage still setting up holds the waiting items
            continue
        for handle in backend.wait(list(inflight), timeout=0.5):
            i, batch = inflight.pop(handle)
            per_stage[i] -= 1
            try:
                outs = backend.outcomes(handle)
            except WorkerLost as err:
                stats[i].items_in -= len(batch)
                for env in reversed(batch):
                    if env.attempts == 0:
                        env.attempts += 1
                        pending[i].appendleft(env)
                    else:
                        errors[env.unit].append(
                            {"stage": stages[i].name, "reason": f"worker died: {err}", "retry": True}
                        )
                        stats[i].errors += 1
                        settle(env.unit, -1)
                continue
            absorb(i, batch, outs)
        backend.rebalance(stats)
        if monitor is not None:
            monitor(stats)
    return units_done
