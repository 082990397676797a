"""`vidforge train` under model-parallel layouts against one process: the same data, the same initial
weights and the same noise, so each step's loss must agree; what differs is only how the model, its
activations and gradients are split over ranks. fp32 on CPU: the tolerance (relative 1e-4 over 3 steps
of AdamW) covers reduction-order differences; a wrong gradient moves the third loss by far more.

Runs `vidforge.train.loop.run` in gloo processes (tests/distributed/ranks.py), one per rank."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ranks import run_ranks  # noqa: E402
from train_fixtures import losses, make_latents, train_profile  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

STEPS = ("train.steps=3", "train.ema_decay=0", "model.heads=4", "data.token_budget=432")

# name -> (ranks, profile overrides)
LAYOUTS = {
    "cp2-all-gather": (2, ["parallel.cp=2", "parallel.cp_impl=all-gather"]),
    "cp2-ring": (2, ["parallel.cp=2", "parallel.cp_impl=ring"]),
    "cp2-ulysses": (2, ["parallel.cp=2", "parallel.cp_impl=ulysses"]),
    "tp2": (2, ["parallel.tp=2"]),
    "fsdp2xtp2": (4, ["parallel.dp_shard=2", "parallel.tp=2"]),
    "tp2xcp2": (4, ["parallel.tp=2", "parallel.cp=2", "parallel.cp_impl=ring"]),
    "dp2xtp2xcp2": (8, ["parallel.dp_shard=2", "parallel.tp=2", "parallel.cp=2"]),
}


def _train(rank: int, world: int, latents: str, run_dir: str, sets: list[str]) -> None:
    from vidforge.train import loop

    profile = train_profile(*STEPS, f"cluster.cpu_processes={world}", "parallel.dp_shard=-1", *sets)
    loop.run(profile, [latents], run_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, list[float]]:
    root = tmp_path_factory.mktemp("layouts")
    # Every sample the same clip: data-parallel ranks then see what the single process sees.
    latents = make_latents(root / "data", identical=True, samples=4)
    run_ranks(_train, 1, str(latents), str(root / "single"), [])
    return latents, losses(root / "single")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name, reference, tmp_path) -> None:
    latents, single = reference
    ranks, sets = LAYOUTS[name]
    run_ranks(_train, ranks, str(latents), str(tmp_path / name), sets)
    got = losses(tmp_path / name)
    assert len(got) == len(single) == 3
    assert got == pytest.approx(single, rel=1e-4, abs=1e-6)
    assert len(set(single)) > 1  # training moved the weights: later losses differ
