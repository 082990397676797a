"""A checkpoint written under one parallel layout resumes under another (DCP resharding): train 2 steps
under one layout, resume for 2 more under a different one (and so on along a chain of layouts), and the
resumed steps' losses equal those of one uninterrupted single-process run of as many steps.

Every sample is the same clip and every rank draws the same noise (one seed), so each layout's data-
parallel mean equals the single-process loss; only the sharding of weights and optimizer states differs
between the save and the load. fp32: the tolerance is reduction-order noise.

A pipeline-parallel run splits the model into stage modules with one optimizer each; its checkpoint is
the stages' state merged by parameter name, and it must load into one whole model and back. The pipeline
takes 2 packed rows per step (pp_microbatches = pp), so the runs without it accumulate 2 rows
(train.grad_accum=2), and so does their reference."""

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
    for dim, size in layout.items():
        nproc *= size if dim != "grad_accum" else 1
    exe = Path(sys.executable).with_name("vidforge")
    sets = [*TRAIN_SETS, "data.shard_max_samples=1", "train.save_every=2", f"train.steps={steps}"]
    # A constant learning rate after warm-up: a cosine schedule depends on train.steps, which differs
    # between the parts of a chain and the reference.
    sets += ["train.schedule=constant"]
    sets += [f"cluster.cpu_processes={nproc}", "parallel.dp_shard=-1"]
    sets += [
        f"parallel.{dim}={size}" for dim, size in layout.items() if dim not in ("dp_shard", "grad_accum")
    ]
    sets += [f"train.grad_accum={layout.get('grad_accum', 1)}"]
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
def data(tmp_path_factory):
    """data(steps, grad_accum) -> the latents and the losses of that many uninterrupted single-process
    steps on them (each reference run once per module)."""
    root = tmp_path_factory.mktemp("reshard")
    latents = make_latents(root / "data", identical=True, samples=4)
    runs: dict[tuple[int, int], list[float]] = {}

    def get(steps: int, grad_accum: int) -> tuple[Path, list[float]]:
        if (steps, grad_accum) not in runs:
            run_dir = root / f"reference-{steps}-{grad_accum}"
            _train(latents, run_dir, steps, {"dp_shard": 1, "grad_accum": grad_accum})
            runs[steps, grad_accum] = losses(run_dir)
        return latents, runs[steps, grad_accum]

    return get


# Each chain trains 2 steps under its first layout, then resumes for 2 more under each next one.
# Weights and optimizer states saved sharded over 2 ranks load whole in one process. (The data position
# is per dp rank and starts over when the dp size changes; every sample is the same clip here.)
# Pipeline stages' state loads into one whole model, and the whole model's into the stages again.
LAYOUT_CHANGES = {
    "fsdp2-to-single": [{"dp_shard": 2}, {"dp_shard": 1}],
    "pp2-to-single-to-pp2": [{"pp": 2}, {"dp_shard": 1, "grad_accum": 2}, {"pp": 2}],
}


@pytest.mark.parametrize("change", list(LAYOUT_CHANGES))
def test_checkpoint_from_one_layout_resumes_under_another(change, data, tmp_path) -> None:
    chain = LAYOUT_CHANGES[change]
    steps = 2 * len(chain)
    grad_accum = 2 if any(layout.get("pp", 1) > 1 for layout in chain) else 1
    latents, reference = data(steps, grad_accum)
    for i, layout in enumerate(chain):
        _train(latents, tmp_path / "run", 2 * (i + 1), layout, resume=i > 0)
    run = losses(tmp_path / "run")
    assert len(reference) == len(run) == steps
    assert run[2:] == pytest.approx(reference[2:], rel=1e-5, abs=1e-6)
