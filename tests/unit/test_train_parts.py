"""Training parts on their own: schedule, EMA, checkpoints (single process)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vidforge.profile.train import Train
from vidforge.train.checkpoint import CheckpointManager
from vidforge.train.ema import EMA
from vidforge.train.lr import lr_multiplier


def test_warmup_then_cosine_to_the_floor() -> None:
    cfg = Train(steps=110, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    values = [lr_multiplier(s, cfg) for s in range(110)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0) and values[-1] == pytest.approx(0.1)
    middle = 10 + 99 // 2  # half-way through the decay the cosine is at its mean
    assert values[middle] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 49 / 99)))
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))


def test_constant_schedule() -> None:
    cfg = Train(steps=20, warmup_steps=0, schedule="constant")
    assert {lr_multiplier(s, cfg) for s in range(20)} == {1.0}


def test_ema_matches_direct_recursion() -> None:
    model = nn.Linear(3, 2)
    ema = EMA(model, decay=0.9)
    expected = model.weight.detach().clone()
    for _ in range(5):
        with torch.no_grad():
            model.weight.add_(torch.randn_like(model.weight))
        ema.update(model)
        expected = 0.9 * expected + 0.1 * model.weight.detach()
    torch.testing.assert_close(ema.state_dict()["weight"], expected)


def _setup(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, EMA(model, 0.5)


def _step(model, opt, ema) -> float:
    x = torch.randn(16, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    ema.update(model)
    return loss.item()


def test_checkpoint_resume_continues_bitwise(tmp_path) -> None:
    model, opt, ema = _setup(0)
    straight = [_step(model, opt, ema) for _ in range(6)]

    model, opt, ema = _setup(0)
    manager = CheckpointManager(tmp_path, keep=2)
    first = [_step(model, opt, ema) for _ in range(3)]
    manager.save(3, model, opt, ema, {"loader": {"position": 3}})
    del model, opt, ema

    model, opt, ema = _setup(123)  # different init: everything must come from the checkpoint
    extra = manager.load(manager.latest(), model, opt, ema)
    assert extra == {"step": 3, "loader": {"position": 3}}
    resumed = first + [_step(model, opt, ema) for _ in range(3)]
    assert resumed == straight


def test_incomplete_checkpoints_are_ignored_and_old_ones_pruned(tmp_path) -> None:
    model, opt, ema = _setup(0)
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        manager.save(step, model, opt, ema, {})
    assert manager.complete_steps() == [2, 3]
    (manager.path(3) / "COMPLETE").unlink()  # as if killed before the marker
    assert manager.latest() == 2
