"""Background loading: a batcher's reading, decoding, packing and bucketing run ahead of the step.

    source = Prefetcher(batcher, depth=2, pin=torch.cuda.is_available())
    batch = source.next_batch()          # waits only when the worker is behind
    state = source.state_dict()          # the position after the batches handed out, not the prefetched ones

One worker thread calls `batcher.next_batch()` and, right after it, `batcher.state_dict()`, and queues the
two together (at most `depth` batches ahead). `state_dict()` returns the state queued with the last batch
the step took, so a checkpoint resumes at what was consumed and the prefetched batches are made again.
The batcher is touched by the worker alone while it runs, so its stream is the synchronous one: every
random choice (shuffle, blending) comes from the loader's own RNGs, none from the step's.

A thread, not processes: tar reads, sha256 and numpy copies release the GIL, and the worker then shares
the loader's shard cache and state without pickling. With `pin`, batches land in page-locked memory so
the step's `.to(device, non_blocking=True)` overlaps the copy with compute."""

from __future__ import annotations

import dataclasses
import queue
import threading
import weakref
from typing import Any

import torch

_END = object()


def pin_batch(batch: Any) -> Any:
    """The batch with its tensors in pinned (page-locked) host memory."""
    changes = {
        f.name: getattr(batch, f.name).pin_memory()
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **changes)


class Prefetcher:
    """A batch source (`next_batch`, `state_dict`, `load_state_dict`) over a batcher, `depth` batches ahead."""

    def __init__(self, batcher: Any, depth: int = 2, pin: bool = False):
        if depth < 1:
            raise ValueError("a Prefetcher needs depth >= 1; use the batcher itself for synchronous loading")
        self.batcher, self.depth, self.pin = batcher, depth, pin
        self._state = batcher.state_dict()
        self._efficiency = getattr(batcher, "efficiency", None)
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._ended = False

    @staticmethod
    def _work(batcher: Any, pin: bool, out: queue.Queue, stop: threading.Event) -> None:
        # No reference to the Prefetcher: a run that dies without close() drops it, and its finalizer
        # stops this thread.
        try:
            while not stop.is_set():
                batch = batcher.next_batch()
                if batch is None:
                    out.put(_END)
                    return
                if pin:
                    batch = pin_batch(batch)
                item = (batch, batcher.state_dict(), getattr(batcher, "efficiency", None))
                while not stop.is_set():
                    try:
                        out.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as err:  # handed to the consumer, raised there: it owns error reporting
            out.put(err)

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(
            target=self._work,
            args=(self.batcher, self.pin, self._queue, self._stop),
            name="vidforge-prefetch",
            daemon=True,
        )
        weakref.finalize(self, self._stop.set)
        self._thread.start()

    def next_batch(self) -> Any:
        if self._ended:
            return None
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if item is _END:
            self._ended = True
            return None
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        batch, self._state, self._efficiency = item
        return batch

    @property
    def efficiency(self) -> float | None:
        """The batcher's packing efficiency over the batches handed out (None when it has none)."""
        return self._efficiency

    def state_dict(self) -> dict[str, Any]:
        return self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self.batcher.load_state_dict(state)
        self._state, self._ended = self.batcher.state_dict(), False

    def close(self) -> None:
        """Stop the worker (it finishes the batch in hand); the batcher then holds the prefetched position."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __iter__(self):
        while (batch := self.next_batch()) is not None:
            yield batch
