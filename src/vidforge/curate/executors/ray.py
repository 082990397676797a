"""The Ray executor: the same stages as actors on a Ray cluster (`--ray-address`, or a local instance).

Workers per stage are balanced by measured throughput, as NeMo Curator does: every stage starts with one
actor, and while worker slots are free the stage with the lowest throughput per worker (the most busy
seconds per item divided by its actors) that has work waiting gets another actor. The driver loop,
backpressure and unit bookkeeping are the local executor's (`base.drive`)."""

from __future__ import annotations

import time
from typing import Any

from vidforge.curate.executors.base import Monitor, UnitCallback, WorkerLost, drive
from vidforge.curate.stage import Outcome, RunStats, Stage, StageStats, run_batch


class _StageActor:
    """Holds one stage; setup runs once when the actor starts (a failure there surfaces on first use)."""

    def __init__(self, stage: Stage):
        stage.setup()
        self.stage = stage

    def run(self, items: list[Any]) -> list[Outcome]:
        return run_batch(self.stage, items)


class RayExecutor:
    def __init__(
        self,
        queue_depth: int = 2,
        address: str | None = None,
        num_cpus: int | None = None,
        max_workers: int | None = None,
        rebalance_every_s: float = 1.0,
    ):
        self.queue_depth, self.address, self.num_cpus = queue_depth, address, num_cpus
        self.max_workers, self.rebalance_every_s = max_workers, rebalance_every_s
        self._actors: list[list[Any]] = []
        self._load: dict[Any, int] = {}
        self._owner: dict[Any, tuple[int, Any]] = {}
        self._pending: list[int] = []
        self._last_rebalance = 0.0

    def run(
        self, stages: list[Stage], units, on_unit: UnitCallback, monitor: Monitor | None = None
    ) -> RunStats:
        return drive(stages, units, on_unit, self, monitor)

    # -- Backend ---------------------------------------------------------------------------------------
    def start(self, stages: list[Stage]) -> None:
        import ray

        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
        budget = float(ray.cluster_resources().get("CPU", 1.0))
        self._slots = self.max_workers or max(len(stages) + 2, int(budget))
        self._cpu_each = budget / self._slots  # Ray's CPUs are for placement; this lets every slot fit
        self._stages = stages
        self._remote = ray.remote(_StageActor)
        self._actors = [[self._new_actor(s)] for s in stages]

    def _new_actor(self, stage: Stage):
        gpus = stage.resources.get("num_gpus", 0)
        return self._remote.options(num_cpus=self._cpu_each, num_gpus=gpus).remote(stage)

    def capacity(self, index: int) -> int:
        return len(self._actors[index]) * self.queue_depth

    def workers(self, index: int) -> int:
        return len(self._actors[index]) if self._actors else 0

    def submit(self, index: int, items: list[Any]):
        actor = min(self._actors[index], key=lambda a: self._load.get(a, 0))
        ref = actor.run.remote(items)
        self._load[actor] = self._load.get(actor, 0) + 1
        self._owner[ref] = (index, actor)
        return ref

    def wait(self, handles: list[Any], timeout: float) -> list[Any]:
        import ray

        ready, _ = ray.wait(handles, num_returns=1, timeout=timeout)
        if ready:
            more, _ = ray.wait(handles, num_returns=len(handles), timeout=0)
            ready = list({*ready, *more})
        return ready

    def outcomes(self, handle) -> list[Outcome]:
        import ray

        index, actor = self._owner.pop(handle)
        self._load[actor] -= 1
        try:
            return ray.get(handle)
        except ray.exceptions.RayActorError as err:
            if actor in self._actors[index]:  # its other in-flight batches fail too: replace it once
                self._actors[index].remove(actor)
                self._actors[index].append(self._new_actor(self._stages[index]))
            raise WorkerLost(str(err).splitlines()[0]) from None

    def rebalance(self, stats: list[StageStats]) -> None:
        now = time.monotonic()
        if now - self._last_rebalance < self.rebalance_every_s:
            return
        self._last_rebalance = now
        if sum(len(a) for a in self._actors) >= self._slots:
            return
        busy = [
            (s.seconds_per_item / len(self._actors[i]), i)
            for i, s in enumerate(stats)
            if s.items_done and s.items_in > s.items_done
        ]  # measured, and has work in flight or queued
        if busy:
            _, slowest = max(busy)
            self._actors[slowest].append(self._new_actor(self._stages[slowest]))

    def stop(self, abort: bool = False) -> None:
        # Actors are killed either way: by the time a run stops normally they have nothing in flight.
        import ray

        for actors in self._actors:
            for actor in actors:
                ray.kill(actor)
        self._actors = []
