"""`vidforge tokenize` under torchrun (2 ranks, gloo, CPU) against one process, with the default profile's
pixel tokenizer: each rank takes a disjoint set of shards, rank 0 writes one index after a barrier, and the
two runs give byte-identical latent shards."""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vidforge.data.shard_index import read_index
from vidforge.data.testing import SMALL_SHARD_SETS, make_annotated_dir

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SETTINGS = SMALL_SHARD_SETS


def _sets() -> list[str]:
    return [arg for item in SETTINGS for arg in ("--set", item)]


def _run(args: list[str], nproc: int = 1, ok: tuple[int, ...] = (0,)) -> tuple[list[dict], str]:
    """Run the CLI (under torchrun when nproc > 1); returns the JSON events of every rank and stderr."""
    cli = ["-m", "vidforge.cli.app", "--json", *args, *_sets()]
    if nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            *cli,
        ]
    else:
        cmd = [sys.executable, *cli]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode in ok, proc.stdout[-2000:] + proc.stderr[-4000:]
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return events, proc.stderr


def _latents(root: Path) -> dict[str, dict[str, bytes]]:
    """Every sample's members, from the tars themselves: {shard/key.member: bytes}."""
    import tarfile

    out: dict[str, dict[str, bytes]] = {}
    for tar in sorted(root.glob("*.tar")):
        with tarfile.open(tar) as f:
            out[tar.name] = {m.name: f.extractfile(m).read() for m in f.getmembers() if m.isfile()}
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tok")
    ann = make_annotated_dir(root / "ann", videos=3, images=2, rejected=1, frames=(6, 12))
    _run(["shard", str(ann), "-o", str(root / "shards")])
    media = read_index(root / "shards")
    assert len(media.shards) == 5 and media.samples == 5  # one sample a shard: uneven split, 3 + 2
    return root / "shards"


def test_two_ranks_match_one_process(tmp_path, shards) -> None:
    names = sorted(s.name for s in read_index(shards).shards)

    one, _ = _run(["tokenize", str(shards), "-o", str(tmp_path / "out1")])
    two, _ = _run(["tokenize", str(shards), "-o", str(tmp_path / "out2")], nproc=2)

    # each rank wrote its own shards, none twice, and together all of them
    written = collections.Counter(e["name"] for e in two if e["event"] == "progress" and e["unit"] == "shard")
    assert sorted(written) == names and set(written.values()) == {1}, written
    results = [e for e in two if e["event"] == "result"]
    assert len(results) == 2  # one summary per rank
    assert sorted(r["written"] for r in results) == [2, 3] and sum(r["samples"] for r in results) == 5
    assert all(r["skipped"] == 0 and r["rejected"] == 0 for r in results)
    (single,) = [e for e in one if e["event"] == "result"]
    assert single["written"] == 5 and single["samples"] == 5

    idx1, idx2 = read_index(tmp_path / "out1"), read_index(tmp_path / "out2")
    assert idx1.kind == idx2.kind == "latent" and idx2.samples == 5
    listed = [s.name for s in idx2.shards]
    assert sorted(listed) == names and len(listed) == len(set(listed))  # every shard once
    assert {s.name: (s.sha256, s.samples, s.bytes) for s in idx1.shards} == {
        s.name: (s.sha256, s.samples, s.bytes) for s in idx2.shards
    }
    for s in idx2.shards:  # the index's checksums are those of the files on disk
        assert hashlib.sha256((tmp_path / "out2" / s.name).read_bytes()).hexdigest() == s.sha256
    assert sorted(p.name for p in (tmp_path / "out2").glob("*.tar")) == names  # no stray or temporary shards

    lat1, lat2 = _latents(tmp_path / "out1"), _latents(tmp_path / "out2")
    assert lat1 == lat2
    arrays = [
        np.load(io.BytesIO(v)) for m in lat2.values() for k, v in m.items() if k.endswith(".latent.npy")
    ]
    assert len(arrays) == 5 and all(a.shape[0] == 3 * 4 * 4 * 4 and np.abs(a).max() > 0 for a in arrays)
    for name in ("manifest.jsonl", "errors.jsonl"):
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()

    # a rerun under torchrun skips every finished shard and rewrites the same index
    before = (tmp_path / "out2" / "index.json").read_text()
    again, _ = _run(["tokenize", str(shards), "-o", str(tmp_path / "out2")], nproc=2)
    results = [e for e in again if e["event"] == "result"]
    assert sum(r["skipped"] for r in results) == 5 and sum(r["written"] for r in results) == 0
    assert (
        json.loads((tmp_path / "out2" / "index.json").read_text())["shards"] == json.loads(before)["shards"]
    )


def test_shard_errors_of_every_rank_reach_errors_jsonl(tmp_path, shards) -> None:
    """A corrupt input shard is reported (exit code 3), not committed, in OUT/errors.jsonl whichever rank
    met it: rank 0 writes that file, so the other ranks' shard errors must reach it."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    names = sorted(s.name for s in read_index(bad).shards)
    for name in (names[1], names[4]):  # rank 1's and rank 0's (rank::world over sorted names)
        data = bytearray((bad / name).read_bytes())
        data[700] ^= 0xFF
        (bad / name).write_bytes(bytes(data))
    _run(["tokenize", str(bad), "-o", str(tmp_path / "out1")], ok=(3,))
    _run(["tokenize", str(bad), "-o", str(tmp_path / "out2")], nproc=2, ok=(1, 3))
    for out in ("out1", "out2"):
        errors = [json.loads(line) for line in (tmp_path / out / "errors.jsonl").read_text().splitlines()]
        assert [e["shard"] for e in errors] == [names[1], names[4]], (out, errors)
        assert all("sha256" in e["reason"] for e in errors)
        assert sorted(s.name for s in read_index(tmp_path / out).shards) == [names[0], names[2], names[3]]
    assert (tmp_path / "out1" / "errors.jsonl").read_bytes() == (
        tmp_path / "out2" / "errors.jsonl"
    ).read_bytes()
