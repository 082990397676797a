"""Distillation (`train.distill`, DMD2) under 2-rank FSDP2 against one process: the student, the fake score
and the frozen teacher each sharded, the fake score's K updates and the student's update inside one step.
Same data on both ranks (tests/distributed/test_train_layouts.py's reference: every sample the same clip,
every rank the same draws), so the losses, the fake score's losses and the exported student must be one
process's. Opt-in (VIDFORGE_TEST_ALL_LAYOUTS=1): the pair takes about a minute on a loaded 2-core machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ranks import run_ranks  # noqa: E402
from train_fixtures import losses, make_latents, train_profile  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.skipif(
        os.environ.get("VIDFORGE_TEST_ALL_LAYOUTS") != "1", reason="opt-in: VIDFORGE_TEST_ALL_LAYOUTS=1"
    ),
]

SETS = (
    "model.layers=1",
    "model.heads=4",
    "train.steps=2",
    "train.ema_decay=0",
    "train.schedule=constant",
    "data.token_budget=432",
    "train.distill.steps=2",
    "train.distill.fake_updates=2",
    "train.distill.guidance=3",
)


def _train(rank: int, world: int, latents: str, teacher: str, run_dir: str) -> None:
    from vidforge.train import loop

    profile = train_profile(
        *SETS, f"train.distill.teacher={teacher}", f"cluster.cpu_processes={world}", "parallel.dp_shard=-1"
    )
    loop.run(profile, [latents], run_dir)


def test_fsdp2_distillation_matches_one_process(tmp_path) -> None:
    import json

    from vidforge.models import build_model
    from vidforge.weights.checkpoint import load_model, save_model

    latents = make_latents(tmp_path / "data", identical=True, samples=4)
    torch.manual_seed(0)
    model = build_model(train_profile(*SETS).model)
    with torch.no_grad():
        for p in model.parameters():  # off the zero-initialised output layers
            p.add_(torch.randn_like(p), alpha=0.05)
    teacher = save_model(model, tmp_path / "teacher")
    run_ranks(_train, 1, str(latents), str(teacher), str(tmp_path / "one"))
    run_ranks(_train, 2, str(latents), str(teacher), str(tmp_path / "fsdp2"))

    def fake(run_dir: Path) -> list[float]:
        return [
            json.loads(line)["fake_loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]

    assert losses(tmp_path / "fsdp2") == pytest.approx(losses(tmp_path / "one"), rel=1e-4, abs=1e-7)
    assert fake(tmp_path / "fsdp2") == pytest.approx(fake(tmp_path / "one"), rel=1e-4)
    ours, theirs = load_model(tmp_path / "fsdp2" / "export"), load_model(tmp_path / "one" / "export")
    mine = dict(ours.named_parameters())
    for key, value in theirs.named_parameters():
        torch.testing.assert_close(mine[key], value, rtol=1e-4, atol=1e-5, msg=key)
