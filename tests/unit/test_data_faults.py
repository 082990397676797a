"""The loader when data is unreadable (issue 23, point 3): every shard unreadable, or nothing readable
left mid-run, is a user error naming the folder (exit 2), never a loop that skips forever."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.loader import DataError, NoReadableData, ShardLoader
from vidforge.data.shard_index import read_index, write_index
from vidforge.data.shard_writer import ShardWriter, npy_bytes
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


# --- one bad latent sample among good ones (issue 38, point 6) ------------------------------------------


def _npy_claiming(shape: tuple[int, ...]) -> bytes:
    """An .npy whose header claims `shape` of float32, followed by 4 bytes: what a damaged or hostile
    shard holds (np.load allocates the claimed size before reading)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 4


BAD_LATENTS = {
    "huge": _npy_claiming((48, 3, 40000, 40000)),  # 858 GiB: a MemoryError
    "flat": npy_bytes(np.zeros(12, np.float32)),  # 1-D: a raw ValueError in the batcher
    "text": npy_bytes(np.full((4, 1, 4, 4), "a")),  # strings
    "nan": npy_bytes(np.full((4, 1, 4, 4), np.nan, np.float32)),  # "TrainingDiverged ... lower train.lr"
    "wide": npy_bytes(np.zeros((5, 1, 4, 4), np.float32)),  # advised model.in_channels=5
}


def _mixed_shards(root: Path, bad: dict[str, bytes]) -> Path:
    """One latent shard of 4-channel samples, good ones and the `bad` latents between them, indexed as
    `vidforge tokenize` indexes (its tokenizer's latent channels named)."""
    emb = npy_bytes(np.ones((8, 16), np.float16))
    mask = npy_bytes(np.ones(8, bool))
    good = {f"good{i}": npy_bytes(np.full((4, 1, 4, 4), i, np.float32)) for i in range(3)}
    with ShardWriter(root / "train-000000.tar") as writer:
        for key, latent in [*good.items(), *bad.items()]:
            writer.add(key, {"latent.npy": latent, "text_emb.npy": emb, "text_mask.npy": mask, "txt": b"x"})
        entry = writer.close()
    write_index(
        root, "latent", [{**entry, "split": "train", "bucket": "all"}], tokenizer={"latent_channels": 4}
    )
    return root


def test_each_bad_latent_sample_is_skipped_and_counted_the_good_ones_read(tmp_path):
    root = _mixed_shards(tmp_path / "s", BAD_LATENTS)
    loader = ShardLoader([root], epochs=1, shuffle_buffer=1)
    assert sorted(s["__key__"] for s in loader) == ["good0", "good1", "good2"]
    assert loader.stats["skipped_samples"] == len(BAD_LATENTS)


@pytest.mark.parametrize(
    "key, why",
    [
        ("huge", r"its header says \(48, 3, 40000, 40000\) float32 \(\d+ bytes\), the member holds 4 bytes"),
        ("flat", r"shape \(12,\) is not \(C, T, H, W\)"),
        ("text", r"<U1 values, not floats"),
        ("nan", r"64 of 64 values are NaN or infinite \(the data, not the learning rate\)"),
        ("wide", r"5 channels where its index's tokenizer gives 4"),
    ],
)
def test_under_on_error_fail_a_bad_latent_is_one_line_naming_the_sample(tmp_path, key, why):
    root = _mixed_shards(tmp_path / "s", {key: BAD_LATENTS[key]})
    with pytest.raises(DataError, match=f"^train-000000.tar: {key}\\.latent\\.npy: .*{why}"):
        list(ShardLoader([root], epochs=1, shuffle_buffer=1, on_error="fail"))
