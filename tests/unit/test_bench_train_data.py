"""`vidforge bench train --data`: the step timed on real latent shards through train's own loader, with the
time it waited for its batches (the data path's share of the step)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import make_latents, train_profile  # noqa: E402

from vidforge.bench.train_bench import BenchStep, run  # noqa: E402
from vidforge.errors import UserInputError  # noqa: E402

BENCH = ("bench.warmup=0", "bench.repeats=2", "data.epochs=100")


@pytest.fixture(scope="module")
def latents(tmp_path_factory) -> Path:
    return make_latents(tmp_path_factory.mktemp("data"))


def test_real_data_steps_report_their_wait(latents) -> None:
    result = run(train_profile(*BENCH), [str(latents)])  # data.prefetch's default: 2 batches ahead
    assert result.data == str(latents)
    # no wall-clock bound (a busy machine moves it): the wait is a part of each step by construction
    assert result.data_wait_s >= 0 and result.data_step_time_s > 0
    assert 0 <= result.data_wait_fraction <= 1
    assert result.step_time_s > 0 and len(result.step_times_s) == 2  # the synthetic timing is still there


def test_shards_that_run_out_say_what_to_change(latents) -> None:
    with pytest.raises(UserInputError, match="ran out after"):
        BenchStep(train_profile("bench.warmup=0", "data.epochs=1")).time_data([str(latents)], 50)
