"""Paths that come from data stay inside their folder (issue 23, point 1): a shard name in `index.json`,
a manifest's `media`, a clip id. Each attack is the one reported: `../../evil.tar` and an absolute name
in a media index, which `vidforge tokenize` joined onto its output folder and wrote; `..` and absolute
`media` in the manifests that `shard` and `caption` read."""

from __future__ import annotations

import json
import shutil

import pytest

from vidforge.curate.captioning.annotator import media_of
from vidforge.data.loader import ShardLoader
from vidforge.data.manifest import read_jsonl, write_jsonl
from vidforge.data.paths import UnsafePath, inside
from vidforge.data.sharding import run as shard_run
from vidforge.data.testing import SMALL_SHARD_SETS, make_annotated_dir, make_latent_shards
from vidforge.profile import load_profile
from vidforge.tokenizers.tokenize import run as tokenize_run

SETS = list(SMALL_SHARD_SETS)


@pytest.fixture(scope="module")
def media_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    ann = make_annotated_dir(root / "ann", videos=3, images=0, rejected=0, frames=(9, 10))
    shard_run(load_profile(None, SETS), ann, root / "shards")
    return root / "shards"


def test_tokenize_refuses_index_names_outside_its_folders(media_shards, tmp_path):
    shards = tmp_path / "in" / "shards"
    shutil.copytree(media_shards, shards)
    index = json.loads((shards / "index.json").read_text())
    escaping, absolute, fine = index["shards"]
    # Each crafted name points at a real copy of its shard, so reading it would succeed: only the name
    # stands between the run and a write outside its output folder.
    shutil.copy(shards / escaping["name"], tmp_path / "evil.tar")
    escaping["name"] = "../../evil.tar"
    victim = tmp_path / "victim.tar"
    shutil.copy(shards / absolute["name"], victim)
    before = victim.read_bytes()
    absolute["name"] = str(victim)
    (shards / "index.json").write_text(json.dumps(index))
    out = tmp_path / "out" / "latents"  # out/../../evil.tar would be tmp_path/evil.tar's sibling tree
    summary = tokenize_run(load_profile(None, SETS), shards, out)
    assert victim.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.tar", "in", "out", "victim.tar"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["latents"]
    assert summary.samples == 1 and summary.written == 1
    reasons = {e["shard"]: e["reason"] for e in read_jsonl(out / "errors.jsonl")}
    assert reasons == {
        "../../evil.tar": "shard name '../../evil.tar' is not a plain file name",
        str(victim): f"shard name {str(victim)!r} is not a plain file name",
    }
    assert [s["name"] for s in json.loads((out / "index.json").read_text())["shards"]] == [fine["name"]]


def test_loader_skips_an_index_name_outside_its_folder(tmp_path):
    root = make_latent_shards(tmp_path / "lat", shards=2, per_shard=3)
    index = json.loads((root / "index.json").read_text())
    (tmp_path / "outside.tar").write_bytes((root / index["shards"][0]["name"]).read_bytes())
    index["shards"][0]["name"] = "../outside.tar"
    (root / "index.json").write_text(json.dumps(index))
    loader = ShardLoader([root], epochs=1)
    got = list(loader)
    assert len(got) == 3 and all(s["__shard__"].startswith(str(root)) for s in got)
    assert loader.stats["skipped_shards"] == 1


def test_shard_refuses_media_outside_the_annotated_folder(tmp_path):
    ann = make_annotated_dir(tmp_path / "ann", videos=2, images=0, rejected=0, frames=(9, 10))
    records = read_jsonl(ann / "manifest.jsonl")
    secret = tmp_path / "secret.mp4"
    shutil.copy(ann / records[0]["media"], secret)  # a readable video: only its path is wrong
    records[0]["media"] = "../secret.mp4"
    records[1]["media"] = str(secret)
    write_jsonl(ann / "manifest.jsonl", records)
    summary = shard_run(load_profile(None, SETS), ann, tmp_path / "shards")
    assert summary.samples == 0
    reasons = {e["media"]: e["reason"] for e in read_jsonl(tmp_path / "shards" / "errors.jsonl")}
    assert reasons == {
        str(secret): f"media {str(secret)!r} is not a path relative to its folder",
        "../secret.mp4": f"media '../secret.mp4' resolves outside {ann}",
    }


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"clip_id": "a", "media": "../x.mp4"}, "media '../x.mp4' resolves outside"),
        ({"clip_id": "a", "media": "/etc/passwd"}, "media '/etc/passwd' is not a path relative"),
        ({"clip_id": "a", "path": "clips/../../x.mp4"}, "path 'clips/../../x.mp4' resolves outside"),
        ({"clip_id": "../../a"}, "clip_id '../../a' is not a plain file name"),
    ],
)
def test_caption_refuses_a_clip_file_or_id_outside_its_folder(tmp_path, record, reason):
    with pytest.raises(UnsafePath, match=reason.replace("(", r"\(")):
        media_of(record, tmp_path)
    assert media_of({"clip_id": "a", "media": "clips/a.mp4"}, tmp_path) == tmp_path / "clips" / "a.mp4"


def test_a_symbolic_link_out_of_the_folder_is_outside(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    with pytest.raises(UnsafePath, match="resolves outside"):
        inside(tmp_path / "root", "link/secret")


def test_caption_records_an_unsafe_clip_as_its_error_and_writes_nothing_outside(tmp_path):
    from vidforge.curate import caption

    clips = tmp_path / "work" / "clips_run"
    (clips / "clips").mkdir(parents=True)
    secret = tmp_path / "work" / "secret.mp4"
    secret.write_bytes(b"private")
    write_jsonl(
        clips / "manifest.jsonl",
        [
            {"clip_id": "a", "media": "../secret.mp4"},
            {"clip_id": "b", "media": str(secret)},
            {"clip_id": "../../escaped"},
        ],
    )
    out = tmp_path / "work" / "out"
    summary = caption.run(load_profile(None, ["curation.caption.backend=sidecar"]), clips, out)
    assert summary.errors == 3 and summary.clips == 0
    reasons = {e["clip_id"]: e["reason"] for e in read_jsonl(out / "errors.jsonl")}
    assert reasons == {
        "a": f"media '../secret.mp4' resolves outside {clips}",
        "b": f"media {str(secret)!r} is not a path relative to its folder",
        "../../escaped": "clip_id '../../escaped' is not a plain file name",
    }
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["clips_run", "out", "secret.mp4"]
    assert not (out / "clips").exists() or not any((out / "clips").iterdir())
