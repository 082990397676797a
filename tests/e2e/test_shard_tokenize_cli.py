"""`vidforge shard` then `vidforge tokenize` from the command line, then the loader packing the latents."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.batching import build_batcher
from vidforge.data.loader import ShardLoader
from vidforge.data.manifest import read_jsonl
from vidforge.data.shard_index import read_index
from vidforge.data.testing import make_annotated_dir
from vidforge.profile import load_profile

SETTINGS = [
    "data.buckets=[[48,64],[64,48],[64,64]]",
    "data.frame_buckets=[1,5,9]",
    "data.shard_max_samples=2",
    "data.val_fraction=0",
    "text_encoder.max_length=16",
    "tokenizer.spatial_compression=4",
    "data.token_budget=1024",
]


def _args(*args):
    out = list(args)
    for item in SETTINGS:
        out += ["--set", item]
    return out


def _result(stdout: str) -> dict:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return next(line for line in lines if line["event"] == "result")


def test_shard_tokenize_and_load(tmp_path):
    ann = make_annotated_dir(tmp_path / "ann", videos=4, images=2, rejected=1, frames=(6, 12))
    records = read_jsonl(ann / "manifest.jsonl")
    (ann / records[0]["media"]).write_bytes(b"\0" * 100)  # an unreadable clip: rejected, exit code 3
    runner = CliRunner()

    res = runner.invoke(app, ["--json", "shard", str(ann), "-o", str(tmp_path / "shards"), *_args()])
    assert res.exit_code == 3, res.output
    summary = _result(res.stdout)
    assert summary["samples"] == 5 and summary["rejected"] == 1 and summary["shards"] == 3
    assert summary["random_weights"] == ["text_encoder"]  # no text_encoder.path: a random tower

    res = runner.invoke(app, ["--json", "shard", str(ann), "-o", str(tmp_path / "shards"), *_args()])
    assert _result(res.stdout)["skipped"] == 3 and _result(res.stdout)["written"] == 0
    res = runner.invoke(app, ["shard", str(ann), "-o", str(tmp_path / "shards"), *_args()])  # as a human
    assert "nothing to do: all 3 shard(s) were written by an earlier run" in res.stderr

    res = runner.invoke(
        app, ["--json", "tokenize", str(tmp_path / "shards"), "-o", str(tmp_path / "lat"), *_args()]
    )
    assert res.exit_code == 0, res.output
    assert _result(res.stdout)["samples"] == 5
    index = read_index(tmp_path / "lat")
    assert index.kind == "latent" and index.samples == 5 and len(index.shards) == 3

    profile = load_profile(None, [*SETTINGS, "data.epochs=1", "model.patch=[1,2,2]"])
    batcher = build_batcher(profile, ShardLoader.from_profile(profile, [tmp_path / "lat"]))
    keys = [k for batch in batcher for k in batch.keys]
    assert sorted(keys) == sorted(r["clip_id"] for r in records[1:6])
    assert 0 < batcher.efficiency <= 1


def test_user_errors_exit_2(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["shard", str(tmp_path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "manifest.jsonl" in res.output
    res = runner.invoke(app, ["tokenize", str(tmp_path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "index.json" in res.output
