"""Hostile inputs, round three (issue 46), the writers and readers its first fixes left outside the one
writer and the one reader (`vidforge.files`): the shard cache's temporary, caption's text-vector logs,
a source's sidecar and the lists a command reads; and every table a command prints escapes its data."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from vidforge import files
from vidforge.data.shard_entry import ShardEntry
from vidforge.data.store import Remote, ShardCache
from vidforge.errors import UserInputError

SECRET = b"the user's own file, outside the cache\n"


def _outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "secret"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(SECRET)
    return target


def test_a_link_planted_at_the_shard_caches_temporary_is_not_written_through(tmp_path):
    import fsspec

    data = os.urandom(4096)
    url = f"memory://hostile-owners-{os.getpid()}"
    fsspec.filesystem("memory").pipe_file(f"{url[len('memory://') :]}/shard-000000.tar", data)
    entry = ShardEntry("shard-000000.tar", "train", 1, len(data), hashlib.sha256(data).hexdigest())
    cache = ShardCache(tmp_path / "cache", 1 << 20)
    cache.folder.mkdir()
    secret = _outside(tmp_path)
    final = cache.folder / f"{entry.sha256}.tar"
    # every predictable name a fetch writes before its rename (this one's and the name the cache used)
    for name in (files.temporary_name(final), final.with_name(f".{final.name}.{os.getpid()}.part")):
        name.symlink_to(secret)

    got = cache.fetch(Remote(url), entry)

    assert secret.read_bytes() == SECRET
    assert got == final and not got.is_symlink() and got.read_bytes() == data


def test_a_caption_vector_log_folder_linking_out_is_refused(tmp_path):
    from vidforge.curate.captioning.store import PENDING, TextLog
    from vidforge.data.embeddings import EMBEDDINGS_DIR

    elsewhere = tmp_path / "outside"
    elsewhere.mkdir()
    (tmp_path / "out" / EMBEDDINGS_DIR).mkdir(parents=True)
    (tmp_path / "out" / EMBEDDINGS_DIR / PENDING).symlink_to(elsewhere)
    log = TextLog(tmp_path / "out")
    with pytest.raises(UserInputError, match="symbolic link"):
        log.append("clip-0", np.ones(4, np.float32))
    assert list(elsewhere.iterdir()) == []


HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "[link=file:///etc/passwd]click[/link]", "a\u202eexe.txt"]
SHOWN = ["\\x1b]0;pwned\\x07", "\\x1b[2J\\x1b[H", "[link=file:///etc/passwd]click[/link]", "a\\u202eexe.txt"]


def test_every_table_a_command_prints_shows_data_as_text(capsys):
    """Not only search's: a summary (`Output.result`, clip's, caption's, dedup's) or a command's own table
    (caption's rejected reasons, profile list) holding a planted clip id prints it as its characters."""
    from vidforge.cli._output import Output

    output = Output()
    output.result({"clip_id": HOSTILE[0], "rejected": HOSTILE[1]}, title=HOSTILE[2])
    output.table([(reason, 1) for reason in HOSTILE], columns=("rejected for", "clips"))
    printed = capsys.readouterr().out
    assert not any(c in printed for c in ("\x1b", "\x07", "\u202e")), repr(printed)
    for shown in SHOWN:
        assert shown in printed, printed


@pytest.mark.parametrize("suffix", [".mp4.captions.json", ".txt"])
def test_a_source_videos_sidecar_linking_out_of_its_folder_is_refused(tmp_path, suffix):
    """The caption sidecar beside a source video (`<video>.captions.json`, `<video>.txt`) is data: one that
    links out of the videos' folder was read as the clip's caption (a file outside the input became
    data); one inside it is read."""
    from vidforge.curate.captioning.captioners.sidecar import SidecarCaptioner
    from vidforge.curate.captioning.checks import check_sidecars
    from vidforge.profile.caption import SidecarCaptioner as SidecarSettings

    videos = tmp_path / "videos"
    videos.mkdir()
    secret = _outside(tmp_path)
    secret.write_text('[{"start": 0, "end": 9, "text": "secret"}]' if suffix.endswith("json") else "secret")
    for name in ("a", "b"):
        (videos / f"{name}.mp4").write_bytes(b"")
    (videos / f"a{suffix}").symlink_to(secret)
    (videos / f"b{suffix}").write_text(secret.read_text())
    link = videos / f"c{suffix}"  # a link inside the folder is an ordinary file of the input
    link.symlink_to(videos / f"b{suffix}")
    (videos / "c.mp4").write_bytes(b"")

    captioner = SidecarCaptioner(SidecarSettings())
    with pytest.raises(UserInputError, match="symbolic link out of"):
        captioner.segments_for(str(videos / "a.mp4"))
    if suffix.endswith(".json"):  # the check before work reads the JSON sidecars
        with pytest.raises(UserInputError, match="symbolic link out of"):
            check_sidecars(SidecarSettings(), [{"source": str(videos / "a.mp4")}])
    for name in ("b", "c"):
        segments, _ = captioner.segments_for(str(videos / f"{name}.mp4"))
        assert [s.text for s in segments] == ["secret"]


def test_a_list_file_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    from vidforge.curate.inputs import read_list_file

    listing = tmp_path / "videos.txt"
    listing.write_bytes(b"caf\xe9.mp4\n")
    with pytest.raises(UserInputError, match=r"videos.txt: the list file is not UTF-8"):
        read_list_file(listing)

    from vidforge.cli.infer_cmd import _prompts

    with pytest.raises(UserInputError, match=r"videos.txt: --prompts-file is not UTF-8"):
        _prompts(None, listing)
