"""Shared fixtures. `examples/` is importable (the sample-video generator lives there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture(scope="session")
def sample_videos(tmp_path_factory) -> Path:
    """The sample-video catalogue (examples/make_sample_videos.py), written once per test session.
    Read-only: copy a file before changing it. `truth.json` maps each name to its ground truth."""
    from make_sample_videos import make_sample_videos

    out = tmp_path_factory.mktemp("sample_videos")
    make_sample_videos(out)
    return out


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven over the DevTools pipe (tests/browser.py); skips without chromium,
    except under CI=true, where it fails."""
    from browser import Browser, chromium_or_skip

    b = Browser(chromium_or_skip())
    yield b
    b.close()


@pytest.fixture(scope="session")
def sample_truth(sample_videos) -> dict[str, dict]:
    """{name: ground truth} of the sample videos."""
    return json.loads((sample_videos / "truth.json").read_text())
