"""The loader when data is unreadable (issue 23, point 3): every shard unreadable, or nothing readable
left mid-run, is a user error naming the folder (exit 2), never a loop that skips forever."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.loader import DataError, NoReadableData, ShardLoader
from vidforge.data.shard_index import read_index
from vidforge.data.testing import make_latent_shards
from vidforge.errors import UserInputError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS  # noqa: E402


def _truncate_all(root: Path) -> None:
    index = read_index(root)
    for entry in index.shards:
        path = index.path(entry)
        path.write_bytes(path.read_bytes()[:700])


def _with_deadline(fn, seconds: float):
    """fn() in a thread; the test fails (instead of hanging) if it has not returned within `seconds`: a hang
    guard for code that used to spin forever, generous enough for a busy machine (the work takes ms)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (spinning on unreadable data)"
    return box


def test_every_shard_unreadable_is_an_error_not_an_endless_loop(tmp_path):
    root = make_latent_shards(tmp_path / "s", shards=3, per_shard=4)
    _truncate_all(root)
    loader = ShardLoader([root], epochs=None, shuffle_buffer=4)  # endless epochs: the case that spun
    box = _with_deadline(lambda: next(iter(loader)), 60)
    assert isinstance(box.get("error"), NoReadableData)
    assert str(box["error"]).startswith(f"{root}: no shard could be read (3 shard(s)")


def test_data_that_goes_unreadable_mid_run_is_an_error(tmp_path):
    root = make_latent_shards(tmp_path / "s", shards=2, per_shard=3)
    loader = ShardLoader([root], epochs=None, shuffle_buffer=2, cache_shards=0)
    stream = iter(loader)
    assert next(stream)["__key__"]  # readable at first
    for path in root.glob("*.tar"):
        path.unlink()  # the disk under the run goes away
    box = _with_deadline(lambda: [next(stream) for _ in range(100)], 60)
    assert isinstance(box.get("error"), NoReadableData)
    assert "no readable data left" in str(box["error"])


def test_some_unreadable_shards_are_skipped_and_the_rest_read(tmp_path):
    root = make_latent_shards(tmp_path / "s", shards=3, per_shard=4)
    index = read_index(root)
    bad = index.path(index.shards[0])
    bad.write_bytes(bad.read_bytes()[:700])
    loader = ShardLoader([root], epochs=None, shuffle_buffer=4)
    got = [s["__shard__"] for _, s in zip(range(40), loader, strict=False)]
    assert len(got) == 40 and str(bad) not in got


def test_train_cli_on_unreadable_shards_exits_2_with_one_line(tmp_path):
    root = make_latent_shards(tmp_path / "s", shards=2, per_shard=2)
    _truncate_all(root)
    args = ["train", "--data", str(root), "--run-dir", str(tmp_path / "run")]
    for s in TRAIN_SETS:
        args += ["--set", s]
    box = _with_deadline(lambda: CliRunner().invoke(app, args), 60)
    result = box["value"]
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {root}: no shard could be read"), result.stderr


def test_under_on_error_fail_a_bad_shard_is_a_user_error_naming_the_fix(tmp_path):
    root = make_latent_shards(tmp_path / "s", shards=2, per_shard=2)
    index = read_index(root)
    bad = index.path(index.shards[1])
    bad.write_bytes(bad.read_bytes()[:700])
    with pytest.raises(DataError) as err:
        list(ShardLoader([root], epochs=1, on_error="fail"))
    assert isinstance(err.value, UserInputError)  # exit 2, one line
    assert str(err.value).startswith(f"{root}/{bad.name}: ")
    assert str(err.value).endswith(
        "(data.on_error=fail): regenerate the shard, or set data.on_error=skip to go on without it"
    )
