"""The GPU suite on the CPU: its driver runs every step at tiny shapes and writes the JSON and the
table (bench/gpu/run.sh --cpu-smoke; sdpa_kernels, offload, tokenize and caption only with
VIDFORGE_TEST_GPU_SUITE_ALL=1), where the `gpu` tests skip with the marker's reason, one row each; the
parts cover every step once; the wheel gathering's lock and completeness check, against pyproject's
dependencies and the device image's package list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import gather  # noqa: E402
import sdpa_kernels  # noqa: E402
import suite  # noqa: E402

# The smoke run's steps that `make test` runs; the others take ~40 s more, so they join only with
# VIDFORGE_TEST_GPU_SUITE_ALL=1 (the test budget).
CI_STEPS = ("train_eager", "infer", "train_compiled", "memory", "correctness", "attention")
STEPS = suite.STEP_NAMES if os.environ.get("VIDFORGE_TEST_GPU_SUITE_ALL") == "1" else CI_STEPS
OBJECT_STORE = {"s3fs", "aiobotocore", "botocore", "aioitertools", "jmespath"}
# What pip on the device image (CPython 3.12.3, glibc 2.39, x86-64) installs, as packaging lists it.
_LINUX = ["linux_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + ["manylinux2014_x86_64"]
DEVICE_TAGS = {*cpython_tags((3, 12), platforms=_LINUX), *compatible_tags((3, 12), "cp312", _LINUX)}


@pytest.mark.slow(minutes=4)  # the whole driver at tiny shapes, inductor included
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
    assert {r["step"] for r in rows} == {
        "train" if s in ("train_eager", "train_compiled") else s for s in STEPS
    }
    # issue 48's rows (with VIDFORGE_TEST_GPU_SUITE_ALL=1): each measured beside its anchor, float8 training
    # saying why it cannot run on the CPU
    for r in rows:
        if r["step"] in ("train_auto", "stack_14b", "distill", "wan22", "sparse", "swap_offload"):
            assert (r["value"] is None and "CUDA" in r["note"]) or r["anchor_value"] > 0, r
    assert not [r for r in rows if r["what"] == "step failed"], [
        r for r in rows if r["what"] == "step failed"
    ]
    # the gpu marker: every gpu test was collected and skipped, with its reason (no CUDA here), one row
    # each, named by its pytest node id, written by the plugin as the test finished
    correctness = [r for r in rows if r["step"] == "correctness"]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    ids = {line.removeprefix("tests/gpu/") for line in collected if line.startswith("tests/gpu/")}
    assert ids and {r["what"] for r in correctness} == ids and len(correctness) == len(ids)
    assert all(r["value"] == "skipped" and "no CUDA" in r["note"] for r in correctness)
    # the infer step follows the profile's objective (flow, as the peer's Wan): its own sampler only
    infer = [r for r in rows if r["step"] == "infer"]
    assert [r["what"] for r in infer] == ["unipc batched: per model call"]
    assert infer[0]["note"].startswith("flow objective") and infer[0]["anchor_value"] > 0
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


def test_rows_plugin_writes_each_test_once_as_it_finishes_under_xdist(tmp_path):
    """bench/gpu/pytest_rows.py under pytest-xdist (the GPU run's correctness step): the collected ids
    first, `slow` tests at their head, then one record per test with its outcome and the first error
    line, from the controller only."""
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def broken():
                raise RuntimeError("setup broke")

            def test_passes():
                pass

            def test_fails():
                assert 1 == 2, "one is not two"

            @pytest.mark.skip(reason="not here")
            def test_skips():
                pass

            def test_setup_error(broken):
                pass

            @pytest.mark.slow
            def test_slow_last_in_the_file():
                pass
            """
        )
    )
    records = tmp_path / "rows.jsonl"
    path = os.pathsep.join([str(ROOT / "bench" / "gpu"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "VIDFORGE_GPU_SUITE_ROWS": str(records), "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "pytest_rows", "-p", "no:cacheprovider", "-n", "2"]
    subprocess.run([*cmd, "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    ids = {
        f"test_sample.py::{name}"
        for name in (
            "test_passes",
            "test_fails",
            "test_skips",
            "test_setup_error",
            "test_slow_last_in_the_file",
        )
    }
    assert set(lines[0]["collected"]) == ids
    assert lines[0]["collected"][0] == "test_sample.py::test_slow_last_in_the_file"
    outcomes = {r["test"]: (r["outcome"], r["message"]) for r in lines[1:]}
    assert len(lines) == 1 + len(ids) and set(outcomes) == ids
    assert outcomes["test_sample.py::test_passes"] == ("passed", "")
    assert outcomes["test_sample.py::test_fails"][0] == "failed"
    assert "one is not two" in outcomes["test_sample.py::test_fails"][1]
    assert outcomes["test_sample.py::test_skips"] == ("skipped", "not here")
    assert outcomes["test_sample.py::test_setup_error"] == ("error", "RuntimeError: setup broke")


def test_sdpa_kernels_names_the_implementation_of_each_attention_call_of_the_step(capsys):
    """bench/gpu/sdpa_kernels.py on the CPU (its GPU path differs only in the profiler's CUDA activity):
    a 2-block wan model's train step with full recompute makes 2 x (self + cross) attention calls a
    forward, each forward twice (the recompute), each backward once; the cross-attention's keys are the
    4 caption tokens. The CPU's SDPA picks its own flash kernel for every one."""
    sets = ["cluster.accelerator=cpu", "cluster.gpus_per_node=1", "model.preset=wan2.1-1.3b"]
    sets += ["diffusion.objective=flow", "model.layers=2", "model.hidden=64", "model.heads=4"]
    sets += ["model.mlp_hidden=128", "model.text_dim=32", "bench.latent_frames=2", "bench.latent_height=4"]
    sets += ["bench.latent_width=4", "bench.text_tokens=4", "train.activation_checkpointing=full"]
    sets += ["train.precision=fp32"]
    sdpa_kernels.main(["--profile", "dit1b_1xh200", *[a for s in sets for a in ("--set", s)]])
    report = json.loads(capsys.readouterr().out)
    calls = {
        (c["phase"], c["implementation"], tuple(c["query"]), tuple(c["key"])): c["count"]
        for c in report["calls"]
    }
    video, text = (1, 4, 8, 16), (1, 4, 4, 16)  # 2 x 4 x 4 latents in 1x2x2 patches: 8 tokens, 4 heads
    assert calls == {
        ("forward", "flash (CPU)", video, video): 4,
        ("forward", "flash (CPU)", video, text): 4,
        ("backward", "flash (CPU)", video, video): 2,
        ("backward", "flash (CPU)", video, text): 2,
    }
    assert report["sdpa_backend"] == "auto" and all(not c["bias"] for c in report["calls"])


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


def test_parts_cover_every_step_once_within_a_device_command():
    steps = [name for part, _ in suite.PARTS.values() for name in part]
    assert sorted(steps) == sorted(suite.STEP_NAMES)
    # each part's budget (the install included) ends inside its 8 or 6 minute command, with 30 s to spare
    assert suite.PARTS["headline"][1] <= 8 * 60 - 30
    assert all(budget <= 6 * 60 - 30 for name, (_, budget) in suite.PARTS.items() if name != "headline")
    assert suite.parse_only(None, "headline")[:3] == ["train_eager", "infer", "train_compiled"]
    with pytest.raises(ValueError, match="--part: unknown part"):
        suite.parse_only(None, "all")


def test_lock_pins_one_device_wheel_a_name_within_the_budget():
    """wheels.lock read straight as text: every pin an exact version with a sha256 and one wheel file of
    that name and version for CPython 3.12 on x86-64 Linux; no object-store client; together (with
    room for vidforge's own wheel, under 1 MiB) within the wheels' budget."""
    lines = [line for line in gather.LOCK.read_text().splitlines() if line and not line.startswith("#")]
    pins = gather.read_lock()
    assert len(pins) == len(lines)
    for name, pin in pins.items():
        wheel_name, version, _, tags = parse_wheel_filename(pin.filename)
        assert canonicalize_name(wheel_name) == name and str(version) == pin.version
        assert len(pin.sha256) == 64 and int(pin.sha256, 16) >= 0
        assert tags & DEVICE_TAGS, f"{pin.filename} does not install on the device's Python"
    assert not OBJECT_STORE & set(pins)
    assert sum(p.size for p in pins.values()) + 2**20 <= gather.WHEELS_BUDGET
    assert _needs_carrying() - set(gather.LEFT_OUT) <= set(pins)


def test_verify_refuses_a_wheel_whose_bytes_are_not_the_locked_ones(tmp_path):
    """A wheel file with a locked name but other bytes (here: a minimal wheel of the smallest pin) is
    named as not the lock's, and the lock's real file as missing."""
    pin = min(gather.read_lock().values(), key=lambda p: p.size)
    dist = pin.filename.split("-")[0] + "-" + pin.version
    with zipfile.ZipFile(tmp_path / pin.filename, "w") as zf:
        zf.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {pin.name}\nVersion: {pin.version}\n"
        )
    problems = gather.verify(tmp_path).problems
    assert f"{pin.filename}: its sha256 is not wheels.lock's; gather.py replaces it" in problems


def test_check_finds_the_lock_complete_for_the_device_python():
    """The lock against the tree, from the index's metadata (pip --dry-run --report: no wheel
    downloads), each locked file checked by its sha256."""
    try:
        plan = gather.check()
    except RuntimeError as err:  # the registry is the only network here; say so if it is unreachable
        pytest.skip(f"package index unreachable: {err}")
    assert plan.problems == []
    assert {canonicalize_name(n) for n in plan.carried} == set(gather.read_lock())
    assert "torch" in plan.image and "torch" not in plan.carried  # the image's CUDA build stays
    assert set(plan.left_out) == set(gather.LEFT_OUT) and not OBJECT_STORE & set(plan.carried)
    gathered = ROOT / ".gpu-wheels"
    if gathered.is_dir():  # a folder gathered here is checked too, offline, against the lock
        verified = gather.verify(gathered)
        assert verified.problems == [] and verified.size_bytes <= gather.WHEELS_BUDGET


@pytest.mark.parametrize("extra", sorted(gather.EXTRA_SETS))
def test_an_extra_set_locks_its_own_wheels_within_a_call(extra):
    """An extra's set (`--extra gpu-decode`: PyNvVideoCodec) read straight from its lock and pyproject:
    every requirement of the extra pinned at a version it accepts, one device wheel each, none already in
    wheels.lock, and the set within one call's wheels' budget on its own."""
    import tomllib

    pins = gather.read_lock(gather.lock_path(extra))
    extra_reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        extra
    ]
    for req in map(Requirement, extra_reqs):
        pin = pins[canonicalize_name(req.name)]
        assert req.specifier.contains(pin.version, prereleases=True)
        assert parse_wheel_filename(pin.filename)[3] & DEVICE_TAGS, f"{pin.filename}: not for the device"
    assert not set(pins) & set(gather.read_lock())
    assert sum(p.size for p in pins.values()) <= gather.WHEELS_BUDGET
    assert gather.dest_path(extra) != gather.DEST


def test_verify_of_an_extra_set_asks_for_its_wheels_only(tmp_path):
    """An empty folder checked as the gpu-decode set lacks PyNvVideoCodec, and not vidforge's own wheel or
    the base set's wheels (the base set travels in its own call)."""
    plan = gather.verify(tmp_path, gather.lock_path("gpu-decode"), "gpu-decode")
    assert any(p.startswith("pynvvideocodec") for p in plan.problems)
    assert not any("vidforge's own wheel" in p or p.startswith("av") for p in plan.problems)
    gathered = gather.dest_path("gpu-decode")
    if gathered.is_dir():  # a folder gathered here is checked too, offline, against its lock
        assert gather.verify(gathered, gather.lock_path("gpu-decode"), "gpu-decode").problems == []
