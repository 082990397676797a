"""A checkpoint written under one parallel layout resumes under another (DCP resharding): train 2 steps
under one layout, resume for 2 more under a different one, and the last two losses equal those of one
uninterrupted single-process run of 4 steps.

Every sample is the same clip and every rank draws the same noise (one seed), so each layout's data-
parallel mean equals the single-process loss; only the sharding of weights and optimizer states differs
between the save and the load. fp32: the tolerance is reduction-order noise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, losses, make_latents  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _train(latents: Path, run_dir: Path, steps: int, layout: dict[str, int], *, resume: bool = False) -> None:
    nproc = 1
    for size in layout.values():
        nproc *= size
    exe = Path(sys.executable).with_name("vidforge")
    sets = [*TRAIN_SETS, "data.shard_max_samples=1", "train.save_every=2", f"train.steps={steps}"]
    sets += [f"cluster.cpu_processes={nproc}", "parallel.dp_shard=-1"]
    sets += [f"parallel.{dim}={size}" for dim, size in layout.items() if dim != "dp_shard"]
    args = [str(exe), "--quiet", "train", "--data", str(latents), "--run-dir", str(run_dir)]
    args += ["--nproc", str(nproc)] if nproc > 1 else []
    args += ["--resume"] if resume else []
    for item in sets:
        args += ["--set", item]
    proc = subprocess.run(
        args, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, list[float]]:
    """The latents and the losses of 4 uninterrupted single-process steps on them."""
    root = tmp_path_factory.mktemp("reshard")
    latents = make_latents(root / "data", identical=True, samples=4)
    _train(latents, root / "reference", 4, {"dp_shard": 1})
    return latents, losses(root / "reference")


# Weights and optimizer states saved sharded over 2 ranks load whole in one process. (The data position
# is per dp rank and starts over when the dp size changes; every sample is the same clip here.)
LAYOUT_CHANGES = {"fsdp2-to-single": ({"dp_shard": 2}, {"dp_shard": 1})}


@pytest.mark.parametrize("change", list(LAYOUT_CHANGES))
def test_checkpoint_from_one_layout_resumes_under_another(change, data, tmp_path) -> None:
    latents, reference = data
    saved, resumed = LAYOUT_CHANGES[change]
    _train(latents, tmp_path / "run", 2, saved)
    _train(latents, tmp_path / "run", 4, resumed, resume=True)
    run = losses(tmp_path / "run")
    assert len(reference) == len(run) == 4
    assert run[2:] == pytest.approx(reference[2:], rel=1e-5, abs=1e-6)
