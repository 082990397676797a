"""Shared fixtures. `examples/` is importable (the sample-video generator lives there)."""

from __future__ import annotations

import json
import os
import sys
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
