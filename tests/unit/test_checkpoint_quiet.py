"""A checkpoint save and load in one process print no warning (DCP's "torch.distributed is disabled" on
each was noise in every run's output)."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from vidforge.train.checkpoint import CheckpointManager


def test_checkpoint_save_and_load_print_no_warning(tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    manager = CheckpointManager(tmp_path, keep=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager.save(1, [model], [optimizer], None, {"note": "x"})
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.weight.zero_()
        extra = manager.load(1, [model], [optimizer], None)
    assert [str(w.message) for w in caught] == []
    assert extra["note"] == "x" and torch.equal(model.weight, saved["weight"])  # it did load
