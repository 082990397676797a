"""Shards on object storage, against a real S3-compatible server (moto's, on 127.0.0.1) through s3fs:
shard and tokenize upload (index last), train reads through the local cache, a second epoch is served
from the cache, a corrupted object is caught by its sha256, and bad input is one line, nothing written."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import train_profile  # noqa: E402

from vidforge.cli.app import app  # noqa: E402
from vidforge.data.energon import energon_available  # noqa: E402
from vidforge.data.loader import DataError, ShardLoader  # noqa: E402
from vidforge.data.shard_index import read_index  # noqa: E402
from vidforge.data.sharding import run as shard_run  # noqa: E402
from vidforge.data.store import StoreSettings  # noqa: E402
from vidforge.data.testing import make_annotated_dir  # noqa: E402
from vidforge.tokenizers.tokenize import run as tokenize_run  # noqa: E402
from vidforge.train import loop  # noqa: E402

moto_server = pytest.importorskip("moto.server")
fsspec = pytest.importorskip("fsspec")
pytest.importorskip("s3fs")

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")  # nothing from this machine's own setup
        mp.setenv("AWS_CONFIG_FILE", "/nonexistent")
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        url = f"http://{host}:{port}"
        fsspec.filesystem("s3", endpoint_url=url, skip_instance_cache=True).mkdir("bkt")
        yield url
    server.stop()


def _fs(endpoint):
    return fsspec.filesystem("s3", endpoint_url=endpoint, skip_instance_cache=True)


def _sets(endpoint, cache):
    return [f"data.storage_options={{endpoint_url: '{endpoint}'}}", f"data.cache_dir={cache}"]


@pytest.fixture(scope="module")
def latents_url(endpoint, tmp_path_factory):
    """Media shards uploaded by `shard`, tokenized from the bucket back into it by `tokenize`."""
    root = tmp_path_factory.mktemp("s3data")
    annotated = make_annotated_dir(
        root / "annotated", videos=4, images=0, rejected=0, size=(48, 64), frames=(9, 12), seed=0
    )
    profile = train_profile("data.shard_max_samples=2", *_sets(endpoint, root / "cache"))
    shard_run(profile, annotated, "s3://bkt/shards")
    tokenize_run(profile, "s3://bkt/shards", "s3://bkt/latents")
    return "s3://bkt/latents"


def test_shard_and_tokenize_upload_every_shard_and_the_index(endpoint, latents_url, tmp_path):
    fs = _fs(endpoint)
    settings = StoreSettings(str(tmp_path / "c"), storage_options={"endpoint_url": endpoint})
    for prefix in ("bkt/shards", "bkt/latents"):
        index = read_index(f"s3://{prefix}", settings)
        names = {p.rsplit("/", 1)[1] for p in fs.ls(prefix)}
        assert {s.name for s in index.shards} | {"index.json"} <= names
        assert len(index.shards) == 2 and index.samples == 4
    assert index.kind == "latent"
    if energon_available():  # Energon's metadata travels with the latent shards
        assert fs.exists("bkt/latents/.nv-meta/dataset.yaml")
        assert all(fs.exists(f"bkt/latents/{s.name}.idx") for s in index.shards)


def test_train_reads_from_the_bucket(endpoint, latents_url, tmp_path):
    profile = train_profile("train.steps=2", "train.save_every=2", *_sets(endpoint, tmp_path / "cache"))
    summary = loop.run(profile, [latents_url], tmp_path / "run")
    assert summary.last_step == 2
    assert len(list((tmp_path / "cache" / "shards").glob("*.tar"))) == 2  # both shards fetched once


def test_second_epoch_is_served_from_the_cache(endpoint, latents_url, tmp_path):
    fs = _fs(endpoint)
    settings = StoreSettings(str(tmp_path / "c"), storage_options={"endpoint_url": endpoint})
    fs.copy("bkt/latents", "bkt/copy", recursive=True)
    loader = ShardLoader(["s3://bkt/copy"], epochs=2, store=settings, shuffle_buffer=1)
    first = [loader.next_sample()["__key__"] for _ in range(4)]
    fs.rm("bkt/copy", recursive=True)  # the second epoch can only come from the local cache
    second = [s["__key__"] for s in loader]
    assert sorted(first) == sorted(second) and len(set(first)) == 4
    cache = loader.indexes[0].remote.cache
    assert cache.stats["misses"] == 2 and cache.stats["hits"] > 0


def test_corrupted_object_is_refetched_then_reported(endpoint, latents_url, tmp_path, caplog):
    fs = _fs(endpoint)
    fs.copy("bkt/latents", "bkt/bad", recursive=True)
    settings = StoreSettings(str(tmp_path / "c"), storage_options={"endpoint_url": endpoint})
    index = read_index("s3://bkt/bad", settings)
    name = index.shards[0].name
    data = bytearray(fs.cat_file(f"bkt/bad/{name}"))
    data[700] ^= 0x01
    fs.pipe_file(f"bkt/bad/{name}", bytes(data))
    with caplog.at_level(logging.WARNING, logger="vidforge.data"):
        loader = ShardLoader(["s3://bkt/bad"], epochs=1, store=settings)
        got = list(loader)
    assert len(got) == 2 and all(s["__shard__"].endswith(".tar") for s in got)
    assert loader.stats["skipped_shards"] == 1 and loader.indexes[0].remote.cache.stats["refetched"] == 1
    assert "sha256 of the object differs from the index" in caplog.text
    assert not list((tmp_path / "c" / "shards").glob(f"{index.shards[0].sha256}*"))  # never cached
    with pytest.raises(DataError, match="sha256 of the object"):
        list(ShardLoader(["s3://bkt/bad"], epochs=1, store=settings, on_error="fail"))


def _one_line_exit_2(args, tmp_path):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    return line


def test_missing_index_is_one_line(endpoint, tmp_path):
    sets = sum((["--set", s] for s in _sets(endpoint, tmp_path / "c")), [])
    line = _one_line_exit_2(
        ["train", "--data", "s3://bkt/nothing", "--run-dir", str(tmp_path / "r"), *sets], tmp_path
    )
    assert "s3://bkt/nothing: no index.json" in line


def test_unreachable_store_and_missing_credentials_write_nothing(endpoint, tmp_path, monkeypatch):
    annotated = make_annotated_dir(
        tmp_path / "a", videos=1, images=0, rejected=0, size=(48, 64), frames=(9, 9)
    )
    unreachable = "{endpoint_url: 'http://127.0.0.1:9', config_kwargs: {retries: {max_attempts: 1}}}"
    args = ["shard", str(annotated), "-o", "s3://bkt/out", "--set", f"data.cache_dir={tmp_path / 'c'}"]
    line = _one_line_exit_2(
        [*args, "--set", f"data.storage_options={unreachable}", "--set", "data.io_retries=1"], tmp_path
    )
    assert "check the endpoint" in line
    for k in CREDENTIALS:
        monkeypatch.delenv(k)
    line = _one_line_exit_2(
        [*args, "--set", f"data.storage_options={{endpoint_url: '{endpoint}'}}"], tmp_path
    )
    assert "set credentials" in line
    assert not (tmp_path / "c").exists()  # refused before any work: nothing staged, nothing uploaded
