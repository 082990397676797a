"""Bench timing (warm-up untimed, median of the timed calls) and the sweep grid's parsing and order."""

from __future__ import annotations

import time

import pytest

from vidforge.bench.sweep import grid_points, parse_grid
from vidforge.bench.timing import Timing, time_calls
from vidforge.errors import UserInputError


def test_time_calls_warms_up_untimed_then_takes_the_median() -> None:
    calls = []

    def work() -> None:
        calls.append(1)
        time.sleep(0.002 if len(calls) > 2 else 0.05)  # the two warm-up calls are slow

    timing = time_calls(work, warmup=2, repeats=3)
    assert len(calls) == 5 and len(timing.samples) == 3
    assert 0.002 <= timing.median < 0.04
    assert Timing((1.0, 3.0, 2.0)).median == 2.0 and Timing((1.0, 3.0, 2.0)).spread == 1.0
    with pytest.raises(ValueError, match="bench.repeats"):
        time_calls(work, warmup=0, repeats=0)


def test_grid_points_are_every_combination_last_field_fastest() -> None:
    grid = parse_grid(["parallel.dp_shard=1,2", "bench.latent_frames=4, 8"])
    assert grid == [("parallel.dp_shard", ["1", "2"]), ("bench.latent_frames", ["4", "8"])]
    assert grid_points(grid) == [
        ["parallel.dp_shard=1", "bench.latent_frames=4"],
        ["parallel.dp_shard=1", "bench.latent_frames=8"],
        ["parallel.dp_shard=2", "bench.latent_frames=4"],
        ["parallel.dp_shard=2", "bench.latent_frames=8"],
    ]
    for bad in ("tp=1,2", "parallel.tp", "parallel.tp="):
        with pytest.raises(UserInputError, match="--grid"):
            parse_grid([bad])
