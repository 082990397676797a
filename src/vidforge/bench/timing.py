"""Timing: warm-up, then the median of N measurements. On CUDA each measurement is a pair of device
events (what the GPU spent, not when the host finished queueing); on CPU a perf_counter interval."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vidforge.errors import UserInputError


@dataclass(frozen=True)
class Timing:
    samples: tuple[float, ...]
    """Seconds of each timed call, in order."""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max - min) / median: how steady the measurement was."""
        return (max(self.samples) - min(self.samples)) / self.median if self.median > 0 else 0.0


class Stopwatch:
    """start() ... stop() -> seconds, with CUDA events on a CUDA device."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.cuda = torch.device(device).type == "cuda"
        self._begin: Any = None
        self._end: Any = None

    def start(self) -> None:
        if self.cuda:
            self._begin = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._begin.record()
        else:
            self._begin = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._end.record()
            self._end.synchronize()
            return self._begin.elapsed_time(self._end) / 1000.0
        return time.perf_counter() - self._begin


def time_calls(
    fn: Callable[[], Any], warmup: int, repeats: int, device: torch.device | str = "cpu"
) -> Timing:
    """Call `fn` warmup times untimed, then `repeats` times timed."""
    if repeats < 1:
        raise UserInputError(f"bench.repeats: need at least 1 timed call, got {repeats}")
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    watch = Stopwatch(device)
    samples = []
    for _ in range(repeats):
        watch.start()
        fn()
        samples.append(watch.stop())
    return Timing(tuple(samples))


def slowest_rank(seconds: float, device: torch.device | str, group: dist.ProcessGroup | None = None) -> float:
    """The largest of `group`'s ranks' times (default: every rank; a step waits for its slowest rank);
    without a process group, this process's own."""
    if not dist.is_initialized():
        return seconds
    value = torch.tensor([seconds], dtype=torch.float64, device=device)  # NCCL reduces on the GPU
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return float(value.item())
