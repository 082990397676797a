"""The driver's stage set-up: a slow (model-loading) set-up runs while the stages before it work, its
error stops the run before its stage gets an item, and a failed run does not wait for items in flight."""

from __future__ import annotations

import threading
import time

import pytest

from vidforge.curate.executors.local import LocalExecutor
from vidforge.curate.stage import Stage
from vidforge.errors import UserInputError


class _Early(Stage):
    """Runs in a thread of the driver, so the test sees what it did."""

    name = "early"
    kind = "thread"

    def __init__(self):
        self.worked = threading.Event()

    def process(self, item):
        self.worked.set()
        return item


class _Model(Stage):
    """A stage whose set-up waits (up to a bound) for the stage before it to have worked."""

    name = "model"
    kind = "thread"
    slow_setup = True

    def __init__(self, early: _Early, fail: bool = False):
        self.early, self.fail = early, fail
        self.overlapped = False
        self.processed: list[int] = []

    def setup(self):
        self.overlapped = self.early.worked.wait(timeout=20)
        if self.fail:
            raise UserInputError("curation.embed_checkpoint: no such file")

    def process(self, item):
        self.processed.append(item)
        return item * 10


def test_a_slow_setup_runs_while_the_stages_before_it_work():
    early = _Early()
    model = _Model(early)
    done = {}
    LocalExecutor(queue_depth=1).run(
        [early, model], [(f"u{n}", n) for n in range(3)], lambda u, r, e: done.update({u: (r, e)})
    )
    assert model.overlapped  # with set-up before any item, `early` could not have worked yet
    assert done == {f"u{n}": ([n * 10], []) for n in range(3)}


def test_a_failed_slow_setup_stops_the_run_before_its_stage_gets_an_item():
    early = _Early()
    model = _Model(early, fail=True)
    with pytest.raises(UserInputError, match="embed_checkpoint"):
        LocalExecutor(queue_depth=1).run([early, model], [(f"u{n}", n) for n in range(3)], lambda *a: None)
    assert early.worked.is_set() and model.processed == []


class _Long(Stage):
    """A worker process busy for a minute with its item (a long source)."""

    name = "long"
    kind = "process"

    def process(self, item):
        time.sleep(60)
        return item


class _Broken(Stage):
    name = "broken"
    kind = "thread"
    slow_setup = True

    def setup(self):
        time.sleep(1.5)  # the long item is in a worker by now
        raise UserInputError("no such model")


def test_a_failed_run_stops_its_workers_instead_of_waiting_for_their_items():
    started = time.perf_counter()
    with pytest.raises(UserInputError, match="no such model"):
        LocalExecutor(queue_depth=1).run([_Long(), _Broken()], [("u", 0)], lambda *a: None)
    assert time.perf_counter() - started < 30  # the item alone takes 60 s
