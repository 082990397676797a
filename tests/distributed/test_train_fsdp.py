"""2-process FSDP2 training (torchrun, gloo, through the real `--nproc` CLI path) against one process.

Every sample is the same clip and both ranks draw the same noise (one seed), so the data-parallel
average equals the single-process loss; what differs is only how the weights, gradients and optimizer
states are sharded and reduced. fp32, so the tolerance is float32 reduction-order noise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, losses, make_latents  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _train(latents: Path, run_dir: Path, nproc: int) -> None:
    exe = Path(sys.executable).with_name("vidforge")
    sets = [*TRAIN_SETS, "data.shard_max_samples=1", "train.steps=4"]  # --nproc alone sets the world
    args = [str(exe), "--quiet", "train", "--data", str(latents), "--run-dir", str(run_dir)]
    args += ["--nproc", str(nproc)] if nproc > 1 else []
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_fsdp2_two_processes_match_one(tmp_path) -> None:
    latents = make_latents(tmp_path / "data", identical=True, samples=4)
    _train(latents, tmp_path / "single", nproc=1)
    _train(latents, tmp_path / "fsdp", nproc=2)
    single, fsdp = losses(tmp_path / "single"), losses(tmp_path / "fsdp")
    assert len(single) == len(fsdp) == 4
    assert fsdp == pytest.approx(single, rel=1e-5, abs=1e-6)
    # and training did something: the weights moved, so later losses differ from the first
    assert len(set(single)) > 1
