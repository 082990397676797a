"""A pipeline stage: one-time `setup` that fails fast, per-item `process` (NeMo Curator's shape).

Stages are plain picklable objects holding their settings; anything heavy (a model, an encoder check) is
made in `setup`, which the executor calls once in the driver before any item reaches the stage (so a
missing checkpoint stops the run before the stage does any work) and once more in every worker process
or actor that runs the stage. A stage with `slow_setup` (it loads models) is set up on a background
thread of the driver while the stages before it start on the first items.

Item flow: `process(item)` returns the item for the next stage, `None` to drop it, or a `list` to fan out
into several items (so items themselves are never lists). Every item belongs to a *unit* (for `clip`, a
source video); the executor calls back when all of a unit's items have left the pipeline, which is when a
stage's output for that unit can be committed atomically.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class ItemError(Exception):
    """A failure that belongs to one item (a corrupt file, an unsupported codec): it is recorded in the
    errors file with the stage's name and this one-line reason, and the batch goes on."""


class Stage(Generic[In, Out]):
    """Base class, typed by what it takes and what it hands on (`Stage[Analysis, SourcePlans]`): the
    stages of a pipeline chain, each one's `Out` the next one's `In` (tests/unit/test_stage_types.py).
    Subclasses set `name`, override `process` (or `process_batch`) and maybe `setup`."""

    name: str = "stage"
    kind: Literal["process", "thread"] = "process"
    """How the local executor runs it: `process` for CPU work that holds the GIL (decode, encode) in a
    process pool; `thread` for model work (torch releases the GIL) on a thread of the driver, so one
    copy of the model serves every item."""
    workers: int = 1
    """Workers in the local executor (0: run inline in the driver). The Ray executor starts with one and
    balances by measured throughput."""
    batch_size: int = 1
    """Items handed to `process_batch` at once (model stages batch; others take one)."""
    resources: dict[str, float] = {"num_cpus": 1}  # noqa: RUF012 - read-only class default
    """Ray resources per worker (e.g. {"num_cpus": 1, "num_gpus": 1} for a model stage on a GPU node)."""
    slow_setup: bool = False
    """Setup takes seconds (it imports torch and loads models): the driver runs it on a background thread,
    so the stages before this one work meanwhile. Its error still stops the run before any item reaches
    this stage."""

    def setup(self) -> None:
        """One-time preparation; raise (UserInputError for something the user must fix) to fail fast."""

    def process(self, item: In) -> Out | list[Out] | None:
        """One item in, an item, None (dropped) or a list (fan-out) out. Override this or process_batch."""
        raise TypeError(f"{type(self).__name__} overrides neither process() nor process_batch()")

    def process_batch(self, items: list[In]) -> list[Out | list[Out] | None]:
        return [self.process(item) for item in items]

    def runs_in_driver(self, item: In) -> bool:
        """True for an item so cheap here that handing it to a worker would cost more than the work (a
        worker process may not even be running yet): the executor runs it in the driver instead."""
        return False

    def teardown(self) -> None:
        """Release what setup made (optional)."""


@dataclass
class Outcome:
    """What a worker hands back for one item: the result or a one-line error, and the time it took."""

    ok: bool
    value: Any = None
    reason: str = ""
    seconds: float = 0.0
    retry: bool = False
    """A failure that is not the item's own (not an ItemError): the next run should try the item again."""


def one_line(err: BaseException) -> str:
    """An exception as one line: ItemError's own text, else `Type: message` with the message's first line."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if isinstance(err, ItemError):
        return text or "failed"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def run_batch(stage: Stage[Any, Any], items: list[Any]) -> list[Outcome]:
    """Run a batch in the current worker, turning exceptions into per-item outcomes (a failing batch is
    retried item by item so one bad item does not take its neighbours down)."""
    start = time.perf_counter()
    try:
        values = stage.process_batch(items)
        each = (time.perf_counter() - start) / max(1, len(items))
        return [Outcome(True, v, seconds=each) for v in values]
    except Exception as err:  # noqa: BLE001 - recorded per item
        if len(items) == 1:
            if not isinstance(err, ItemError) and _debug():
                traceback.print_exc()
            return [
                Outcome(
                    False,
                    reason=one_line(err),
                    seconds=time.perf_counter() - start,
                    retry=not isinstance(err, ItemError),
                )
            ]
    return [o for item in items for o in run_batch(stage, [item])]


def _debug() -> bool:
    import os

    return os.environ.get("VIDFORGE_DEBUG") == "1"


@dataclass
class StageStats:
    """Per-stage counters the executors fill (and the CLI prints)."""

    name: str
    items_in: int = 0
    items_done: int = 0
    items_out: int = 0
    errors: int = 0
    busy_seconds: float = 0.0
    workers: int = 0

    @property
    def seconds_per_item(self) -> float:
        return self.busy_seconds / self.items_in if self.items_in else 0.0

    def summary(self) -> dict[str, Any]:
        """The stage's line in a run summary (summary.json)."""
        return {
            "stage": self.name,
            "items": self.items_in,
            "errors": self.errors,
            "workers": self.workers,
            "busy_seconds": round(self.busy_seconds, 3),
        }


@dataclass
class RunStats:
    stages: list[StageStats] = field(default_factory=list)
    units: int = 0
    wall_seconds: float = 0.0
