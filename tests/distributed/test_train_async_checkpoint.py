"""Async DCP checkpoints (`train.async_checkpoint=true`) in a 2-process gloo group: the save returns before
the files are written, and the checkpoint counts as complete (COMPLETE marker, `latest()`) only after
`wait()`; it then loads back into a fresh model on both ranks."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from vidforge.train.checkpoint import MARKER, CheckpointManager
from vidforge.train.ema import EMA

pytestmark = [pytest.mark.distributed]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(torch.randn(3, 8)).sum().backward()
        optimizer.step()
        ema = EMA(model, 0.9)
        manager = CheckpointManager(root, keep=2, use_async=True)
        manager.save(5, model, optimizer, ema, {"loader": {"rank": rank}})
        assert manager._pending is not None, "async_save was not used"
        assert not (manager.path(5) / MARKER).exists() and manager.latest() is None
        saved = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():  # training goes on while the write is in flight: the checkpoint must not see it
            for p in model.parameters():
                p.add_(1.0)
        manager.wait()
        assert (manager.path(5) / MARKER).read_text() == "5" and manager.latest() == 5
        dist.barrier()

        torch.manual_seed(1)
        fresh = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
        fresh(torch.randn(3, 8)).sum().backward()
        fresh_opt.step()
        extra = CheckpointManager(root).load(5, fresh, fresh_opt, EMA(fresh, 0.9))
        assert extra == {"step": 5, "loader": {"rank": rank}}
        for a, b in zip(saved, fresh.parameters(), strict=True):
            assert torch.equal(a, b)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_async_checkpoint_is_complete_only_after_wait(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    names = {p.name for p in (tmp_path / "checkpoints" / "step_00000005").iterdir()}
    assert {MARKER, ".metadata", "rank00000.json", "rank00001.json"} <= names
