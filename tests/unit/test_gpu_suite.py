"""The GPU suite on the CPU: its driver runs every step at tiny shapes and writes the JSON and the
table (bench/gpu/run.sh --cpu-smoke; tokenize and caption only with VIDFORGE_TEST_GPU_SUITE_ALL=1), where the `gpu` tests skip with the marker's reason; the wheel gathering's
completeness check, against pyproject's dependencies and the device image's package list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import gather  # noqa: E402
import suite  # noqa: E402

# The smoke run's steps that `make test` runs (~33 s of CPU); tokenize and caption take ~30 s more, so
# they join only with VIDFORGE_TEST_GPU_SUITE_ALL=1 (the test budget).
CI_STEPS = ("correctness", "attention", "train", "infer", "memory")
STEPS = suite.STEP_NAMES if os.environ.get("VIDFORGE_TEST_GPU_SUITE_ALL") == "1" else CI_STEPS


def test_cpu_smoke_runs_the_steps_and_writes_the_table(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("VIDFORGE_GPU_TESTS_DEVICE", None)
    proc = subprocess.run(
        ["bash", "bench/gpu/run.sh", "--cpu-smoke", "--out", str(tmp_path), "--only", ",".join(STEPS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_suite.json").read_text())
    rows = report["rows"]
    assert report["smoke"] and report["steps"] == list(STEPS)
    assert {r["step"] for r in rows} == set(STEPS)
    assert not [r for r in rows if r["what"] == "step failed"], [
        r for r in rows if r["what"] == "step failed"
    ]
    # the gpu marker: every gpu test was collected and skipped, with its reason (no CUDA here)
    correctness = [r for r in rows if r["step"] == "correctness"]
    assert correctness and all(r["value"] == "skipped" and "no CUDA" in r["note"] for r in correctness)
    # measurements sit beside their anchors, and the ratio is theirs
    by_what = {(r["step"], r["what"]): r for r in rows}
    train = next(
        r for (step, what), r in by_what.items() if step == "train" and what.startswith("step time (eager")
    )
    assert train["value"] > 0 and train["anchor_value"] > 0
    assert train["ratio"] == pytest.approx(train["value"] / train["anchor_value"])
    memory = [r for r in rows if r["step"] == "memory"]
    assert memory and all(r["value"] > 0 and r["anchor_value"] > 0 for r in memory)
    assert {r["what"].split()[0] for r in rows if r["step"] == "attention"} == {
        "sdpa[auto]",
        "dense",
        "flex",
        "flash",
    }
    table = (tmp_path / "gpu_suite.md").read_text().splitlines()
    assert table[2].startswith("| step | what | value |") and len(table) == 4 + len(rows)


def _needs_carrying() -> set[str]:
    """Direct runtime dependencies of vidforge that the device image lacks, read straight from
    pyproject.toml and image_packages.txt (the reference for the walk)."""
    import tomllib

    image = {
        canonicalize_name(line.split("==")[0])
        for line in (ROOT / "bench/gpu/image_packages.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {canonicalize_name(Requirement(d).name) for d in deps}
    return (names - image) | set(gather.CARRY_ANYWAY)


def test_verify_names_every_dependency_an_empty_folder_lacks(tmp_path):
    plan = gather.verify(tmp_path)
    missing = {
        canonicalize_name(p.split(":")[0].split("<")[0].split(">")[0].split("=")[0]) for p in plan.problems
    }
    assert _needs_carrying() - set(gather.LEFT_OUT) <= missing
    assert any("vidforge's own wheel" in p for p in plan.problems)
    assert not plan.as_dict()["complete"]


def test_this_environment_passes_the_on_device_check():
    """--installed walks the same tree over importlib.metadata: here every dependency is installed."""
    plan = gather.installed()
    assert plan.problems == [] and "pydantic" in plan.carried and "torch" in plan.carried


def test_check_resolves_a_complete_set_for_the_device_python():
    """The resolution from the index's metadata (pip --dry-run --report: no wheel downloads)."""
    try:
        plan = gather.walk(gather.index_source, gather.image_packages(), gather.project_requirements())
    except RuntimeError as err:  # the registry is the only network here; say so if it is unreachable
        pytest.skip(f"package index unreachable: {err}")
    assert plan.problems == []
    assert _needs_carrying() - set(gather.LEFT_OUT) <= set(plan.carried)
    assert "torch" in plan.image and "torch" not in plan.carried  # the image's CUDA build stays
    assert set(plan.left_out) == set(gather.LEFT_OUT)
    gathered = ROOT / ".gpu-wheels"
    if gathered.is_dir():  # a folder gathered here is checked too, offline
        assert gather.verify(gathered).problems == []
