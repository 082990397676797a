"""Shared fixtures. `examples/` is importable (the sample-video generator lives there)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

# Under pytest-xdist (`make test` runs a worker per core) each worker, and every vidforge process a test
# starts, gets its share of the cores: torch's intra-op threads of two workers would otherwise fight over
# the same cores. Set before any test module imports torch, which reads it once.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


def pytest_configure(config):
    """Under xdist, files go out in the collection order below: xdist's own reorder (files with the most
    tests first) would start the demo, the longest file by far, a third of the way in."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _order(minutes: float, distributed: bool) -> tuple[int, float]:
    """Where a file goes in the run: the long single-process files first (the demo's 8 minutes on one
    core, beside the other worker's short files), then the rest, and the files that start several
    processes (`distributed`) last, the longest first: run beside the demo they took the cores its
    training needs and it ran past its timeout."""
    return (1 if distributed else 0, -minutes)


def pytest_collection_modifyitems(config, items):
    """The run's order (a stable sort: each file's tests keep their order; see `_order`): a file's weight
    is the most minutes a `slow` marker in it names (1 where it names none), 0 without one. `gpu` tests
    skip, saying why, where torch sees no CUDA device (VIDFORGE_GPU_TESTS_DEVICE=cpu runs them on the CPU
    instead, to check the tests themselves). torch is imported only if there are any."""
    minutes: dict[Path, float] = {}
    distributed: set[Path] = set()
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is not None:
            minutes[item.path] = max(minutes.get(item.path, 0.0), mark.kwargs.get("minutes", 1.0))
        if item.get_closest_marker("distributed") is not None:
            distributed.add(item.path)
    items.sort(key=lambda item: _order(minutes.get(item.path, 0.0), item.path in distributed))
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu or os.environ.get("VIDFORGE_GPU_TESTS_DEVICE") == "cpu":
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="gpu: no CUDA device visible (torch.cuda.is_available() is False); "
        "run `make gpu-suite` on a GPU machine, or VIDFORGE_GPU_TESTS_DEVICE=cpu to check the tests on the CPU"
    )
    for item in gpu:
        item.add_marker(skip)


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


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file under `root`."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def _saved_once(tmp_path_factory, save: Callable[[Path, object], Path]) -> Callable[[object], Path]:
    """get(key) -> the folder `save(folder, key)` wrote, written on a worker's first call for that key and
    handed out again after; each time checked unchanged since (a test that wrote into the shared folder
    fails the next one that asks for it, naming the files, instead of passing it a different folder)."""
    saved: dict[object, tuple[Path, dict]] = {}

    def get(key):
        if key not in saved:
            folder = save(tmp_path_factory.mktemp("published") / "pipeline", key)
            saved[key] = folder, _listing(folder)
        folder, listing = saved[key]
        now = _listing(folder)
        changed = sorted(k for k in listing.keys() | now.keys() if listing.get(k) != now.get(k))
        assert not changed, f"a test changed the shared folder {folder}: {changed[:5]}"
        return folder

    return get


@pytest.fixture(scope="session")
def hunyuan15_folder(tmp_path_factory) -> Callable[[str], Path]:
    """folder(task="t2v") -> HunyuanVideo-1.5's tiny published folder, "t2v" (HunyuanVideo15Pipeline's) or
    "i2v" (the image-to-video pipeline's), saved by diffusers (tests/hunyuan15_fixtures.py) once per worker
    and shared by every test that asks. Read-only: copy it before changing anything in it."""
    from hunyuan15_fixtures import save_tiny_pipeline

    get = _saved_once(tmp_path_factory, lambda folder, task: save_tiny_pipeline(folder, task))
    return lambda task="t2v": get(task)


@pytest.fixture(scope="session")
def ltx2_folder(tmp_path_factory) -> Callable[[bool], Path]:
    """folder(audio_to_video=True) -> LTX-2's tiny published folder (tests/ltx2_fixtures.py; False: the
    audio-to-video attention zeroed, the video path alone), saved by diffusers once per worker and shared
    by every test that asks. Read-only: copy it before changing anything in it."""
    from ltx2_fixtures import save_tiny_pipeline

    get = _saved_once(tmp_path_factory, lambda folder, a2v: save_tiny_pipeline(folder, audio_to_video=a2v))
    return lambda audio_to_video=True: get(audio_to_video)
