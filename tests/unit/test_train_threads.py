"""A run fixes its CPU intra-op thread count (issue 46 item 15): every checkpoint records it and a
resume computes with it again, whatever the resuming process was started with (OMP_NUM_THREADS,
`torch.set_num_threads`), so the resumed steps sum in the order the uninterrupted run's did."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from vidforge.train import loop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import killed_at_forward, losses, synthetic_latents, train_profile  # noqa: E402

SHORT = ("train.steps=3", "train.save_every=2")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_resume_computes_with_the_thread_count_the_run_started_with(tmp_path, monkeypatch, threads):
    data = synthetic_latents(tmp_path)
    torch.set_num_threads(2)
    whole = tmp_path / "whole"
    loop.run(train_profile(*SHORT), [data], whole)

    part = tmp_path / "part"
    with killed_at_forward(monkeypatch, 3):  # killed after its step-2 checkpoint
        loop.run(train_profile(*SHORT), [data], part)
    saved = json.loads((part / "checkpoints" / "step_00000002" / "rank00000.json").read_text())
    assert saved["threads"] == 2

    torch.set_num_threads(1)  # the shell the run is resumed from says otherwise
    seen: list[int] = []
    lines: list[str] = []
    loop.run(
        train_profile(*SHORT),
        [data],
        part,
        resume=True,
        on_step=lambda step: seen.append(torch.get_num_threads()),
        notice=lines.append,
    )
    assert seen == [2]
    assert any(line.startswith("CPU threads: 1 in this process, 2 when the run started") for line in lines)
    assert losses(part) == losses(whole)
