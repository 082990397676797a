"""Pipeline x context parallel with the ST-DiT hybrid (parallel.cp_impl=st-hybrid): pp2 x cp2 on 4 gloo
ranks against one process, as tests/distributed/test_train_layouts.py holds the other cp_impls (losses,
gradient norms, the export). A layout of its own data: st-hybrid splits every clip by frames, so the
latents are tokenized at 5 frames (2 latent frames, one a cp rank), where the layout tests' 9 frames give
3. An opt-in extra (VIDFORGE_TEST_ALL_LAYOUTS=1): its data and two runs took 110 s on a busy 2-core machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranks import run_ranks  # noqa: E402
from test_train_layouts import CLIP, _metric, _train  # noqa: E402
from train_fixtures import losses, make_latents  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.skipif(
        os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") != "1",
        reason="an opt-in extra: VIDFORGE_TEST_ALL_LAYOUTS=1",
    ),
]

STDIT = ("model.architecture=stdit", "data.frame_buckets=[5]", *CLIP)


def test_pp2xcp2_st_hybrid_matches_one_process(tmp_path) -> None:
    from vidforge.weights.checkpoint import load_model

    latents = make_latents(tmp_path / "data", identical=True, samples=4, sets=STDIT)
    single, layout = tmp_path / "single", tmp_path / "pp2xcp2"
    # the pipeline's 2 micro-batches a step are 2 packed rows: one process accumulates 2 rows
    run_ranks(_train, 1, str(latents), str(single), [*STDIT, "train.grad_accum=2"])
    pp_cp = ["parallel.pp=2", "parallel.pp_microbatches=2", "parallel.cp=2", "parallel.cp_impl=st-hybrid"]
    run_ranks(_train, 4, str(latents), str(layout), [*STDIT, *pp_cp])
    expected = losses(single)
    assert len(expected) == 3 and len(set(expected)) > 1  # train.steps=3 (STEPS), and they moved the weights
    assert losses(layout) == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert _metric(layout, "grad_norm") == pytest.approx(_metric(single, "grad_norm"), rel=1e-4)
    theirs = dict(load_model(single / "export").named_parameters())
    ours = dict(load_model(layout / "export").named_parameters())
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-4, atol=1e-5, msg=key)
