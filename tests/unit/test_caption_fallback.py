"""`curation.caption.fallback`: the sources' own captions first, an endpoint only for the clips that have
none (no sidecar for their source, or no segment covering them), against the test's local VLM server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_caption_endpoint import SECRET, server  # noqa: E402, F401  (server: the local VLM fixture)

from vidforge.curate.captioning.captioners import ClipItem, build_captioner  # noqa: E402
from vidforge.profile import load_profile  # noqa: E402


def _item(source: Path, start: float, end: float, level: int) -> ClipItem:
    frames = {i: np.full((64, 80, 3), level, np.uint8) for i in range(20)}
    record = {"source": str(source), "start_s": start, "end_s": end}
    return ClipItem(clip_id=f"c{level}", record=record, num_frames=20, frames=frames)


def test_the_endpoint_captions_only_clips_without_a_caption_of_their_own(server, tmp_path, monkeypatch):  # noqa: F811
    vlm, url = server
    monkeypatch.setenv("VIDFORGE_TEST_VLM_KEY", SECRET)
    captioned, bare = tmp_path / "captioned.mp4", tmp_path / "bare.mp4"
    (tmp_path / "captioned.mp4.captions.json").write_text(
        json.dumps([{"start": 0.0, "end": 2.0, "text": "A red square moves right."}])
    )
    profile = load_profile(
        None,
        [
            "curation.caption.backend=sidecar",
            "curation.caption.fallback=endpoint",
            f"curation.caption.endpoint.url={url}",
            "curation.caption.endpoint.model=test-vlm",
            "curation.caption.endpoint.api_key_env=VIDFORGE_TEST_VLM_KEY",
            "curation.caption.endpoint.frames=5",
        ],
    )
    captioner = build_captioner(profile.curation.caption)
    captioner.setup()
    items = [
        _item(captioned, 0.0, 2.0, 50),  # covered by its source's sidecar
        _item(captioned, 5.0, 7.0, 60),  # its source has captions, none for these seconds
        _item(bare, 0.0, 2.0, 70),  # its source came without captions
    ]
    results = captioner.caption(items)
    captioner.close()
    assert [r.text for r in results] == [
        "A red square moves right.",
        "A clip whose mean level is 60.",
        "A clip whose mean level is 70.",
    ]
    assert results[0].source.startswith("sidecar") and not results[1].source.startswith("sidecar")
    assert sorted(r["level"] for r in vlm.requests) == [60, 70]  # no model call for the captioned clip
    assert vlm.problems == []


def test_a_fallback_needs_the_sidecar_backend() -> None:
    with pytest.raises(ValueError, match="fallback"):
        load_profile(None, ["curation.caption.backend=coca", "curation.caption.fallback=endpoint"])
