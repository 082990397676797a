"""`--resume` never runs code planted in a checkpoint (issue 23, point 4). Two places DCP unpickles: the
`.metadata` file (plain pickle) and each non-tensor value (torch.load without weights_only). A crafted
file in each runs a shell command under stock DCP; through ours it is refused and nothing runs."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from vidforge.errors import UserInputError
from vidforge.train.checkpoint import CheckpointManager, merged_state
from vidforge.train.safe_dcp import UnsafeCheckpoint, read_metadata


class Planted:
    """Unpickling this runs `touch <marker>`: what an attacker puts in a checkpoint."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _saved(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    manager = CheckpointManager(tmp_path / "run")
    manager.save(1, model, optimizer, None, {"loader": {"at": 7}})
    return manager, model, optimizer


def _fresh():
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=5.0)


def test_a_clean_checkpoint_loads_every_tensor_and_value(tmp_path):
    manager, model, optimizer = _saved(tmp_path)
    fresh, fresh_opt = _fresh()
    extra = manager.load(1, fresh, fresh_opt, None)
    assert extra["loader"] == {"at": 7}
    assert torch.equal(fresh.weight, model.weight) and fresh_opt.param_groups[0]["lr"] == 1e-3
    exp = optimizer.state[model.weight]["exp_avg"]
    assert torch.equal(fresh_opt.state[fresh.weight]["exp_avg"], exp)


def test_planted_metadata_runs_nothing(tmp_path):
    manager, _, _ = _saved(tmp_path)
    marker = tmp_path / "ran"
    meta = manager.path(1) / ".metadata"
    with open(meta, "rb") as f:
        real = pickle.load(f)  # noqa: S301 - our own file, just written
    real.planner_data = Planted(marker)  # the payload rides inside otherwise valid metadata
    meta.write_bytes(pickle.dumps(real))
    with pytest.raises(UnsafeCheckpoint, match="names posix.system, which checkpoint metadata never holds"):
        manager.load(1, *_fresh(), None)
    assert not marker.exists()
    with open(meta, "rb") as f:
        pickle.load(f)  # noqa: S301 - shows the file is the attack: stock unpickling runs it
    assert marker.exists()


def test_planted_value_runs_nothing(tmp_path):
    manager, model, optimizer = _saved(tmp_path)
    marker = tmp_path / "ran"
    model_sd, optim_sd, _ = merged_state(model, optimizer)
    optim_sd["param_groups.weight.lr"] = Planted(marker)  # a name the resume asks for
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(manager.path(1)))
    with pytest.raises(UnsafeCheckpoint, match="'optim.param_groups.weight.lr' is not plain data"):
        manager.load(1, *_fresh(), None)
    assert not marker.exists()
    # The metadata of this checkpoint is DCP's own, and reads fine: only the value was refused.
    assert read_metadata(manager.path(1) / ".metadata").state_dict_metadata


def test_metadata_naming_a_file_outside_the_checkpoint_is_refused_before_it_is_read(tmp_path):
    """Issue 38, point 10: a `.metadata` whose storage entries name `../../x.distcp` had DCP read that file
    outside the checkpoint folder."""
    manager, _, _ = _saved(tmp_path)
    outside = tmp_path / "x.distcp"
    outside.write_bytes(b"\0" * 64)
    meta = manager.path(1) / ".metadata"
    with open(meta, "rb") as f:
        real = pickle.load(f)  # noqa: S301 - our own file, just written
    for info in real.storage_data.values():
        info.relative_path = "../../x.distcp"
    with open(meta, "wb") as f:
        pickle.dump(real, f)
    with pytest.raises(UnsafeCheckpoint, match=r"'\.\./\.\./x\.distcp' is not a plain file name; refusing"):
        manager.load(1, *_fresh(), None)


def test_a_damaged_tensor_file_is_one_user_error_not_dcps_exception(tmp_path):
    manager, _, _ = _saved(tmp_path)
    for data in manager.path(1).glob("*.distcp"):
        data.write_bytes(data.read_bytes()[:20])
    with pytest.raises(
        UserInputError, match=r"cannot load this checkpoint \(.*\); resume from the one before"
    ):
        manager.load(1, *_fresh(), None)
