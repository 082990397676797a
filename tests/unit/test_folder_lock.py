"""One writer per output folder (issue 23, point 2): a second process is refused with one line (exit 2)
while the first writes, a killed holder does not keep the lock, and a unit that failed for a reason other
than its input is redone by the next run instead of being remembered as done."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.curate.stage import ItemError, Stage, run_batch
from vidforge.data.folder_lock import LOCK, FolderBusy, FolderLock
from vidforge.data.units import UnitLedger
from vidforge.errors import UserInputError

SRC = str(Path(__file__).resolve().parents[2] / "src")
HOLD = "import sys, time; from vidforge.data.folder_lock import FolderLock; lock = FolderLock(sys.argv[1]); print('held', flush=True); time.sleep(60)"


def _holder(folder: Path) -> subprocess.Popen:
    """Another process holding `folder`'s lock (as a running stage does), until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_and_a_killed_holder_frees_the_folder(tmp_path):
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        with pytest.raises(FolderBusy, match=f"^{out}: vidforge pid {proc.pid} is writing this folder"):
            UnitLedger(out).recover()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    UnitLedger(out).recover()  # the dead process holds nothing


def test_the_lock_is_reentrant_in_one_process_and_released_by_the_last_holder(tmp_path):
    a, b = FolderLock(tmp_path), FolderLock(tmp_path)
    a.release()
    probe = [
        sys.executable,
        "-c",
        "import sys; from vidforge.data.folder_lock import FolderLock; FolderLock(sys.argv[1])",
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONPATH": SRC}
    assert subprocess.run(probe, env=env, capture_output=True).returncode == 1  # b still holds it
    b.release()
    assert subprocess.run(probe, env=env, capture_output=True).returncode == 0
    assert (tmp_path / LOCK).is_file()


@pytest.mark.parametrize("command", ["clip", "caption", "shard", "tokenize", "train"])
def test_every_stage_refuses_a_folder_another_run_writes(tmp_path, sample_videos, command):
    inputs = {
        "clip": sample_videos / "red_square.mp4",
        "caption": tmp_path / "clips",
        "shard": tmp_path / "captioned",
        "tokenize": tmp_path / "shards",
        "train": tmp_path / "latents",  # the run directory is locked before the data is read
    }[command]
    _prepare_input(command, inputs, sample_videos)
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        started = time.perf_counter()
        args = (
            ["--data", str(inputs), "--run-dir", str(out)]
            if command == "train"
            else [str(inputs), "-o", str(out)]
        )
        result = CliRunner().invoke(app, [command, *args])
        assert time.perf_counter() - started < 10
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {out}: vidforge pid {proc.pid} is writing this folder; wait for it to finish or pass "
        "another output folder"
    ]
    assert not (out / "manifest.jsonl").exists()


def _prepare_input(command: str, path: Path, sample_videos: Path) -> None:
    """The least input each stage reads before it takes its output folder's lock."""
    if command == "caption":
        path.mkdir()
        (path / "manifest.jsonl").write_text(json.dumps({"clip_id": "a", "media": "clips/a.mp4"}) + "\n")
    elif command == "shard":
        path.mkdir()
        (path / "manifest.jsonl").write_text("")
    elif command == "tokenize":
        from vidforge.data.shard_index import write_index

        write_index(path, "media", [])


class _Flaky(Stage):
    name = "flaky"

    def process(self, item):
        if item == "bad input":
            raise ItemError("cannot decode")
        raise FileNotFoundError("clips/.x.tmp-1.mp4")  # what the other run's clean-up did


def test_a_failure_not_of_the_input_is_retried_by_the_next_run(tmp_path):
    bad, lost = run_batch(_Flaky(), ["bad input"]), run_batch(_Flaky(), ["fine input"])
    assert not bad[0].retry and lost[0].retry
    ledger = UnitLedger(tmp_path)
    ledger.commit("bad.mp4", [], [{"reason": bad[0].reason}])
    ledger.commit("fine.mp4", [], [{"reason": lost[0].reason}], retry=True)
    assert ledger.is_done("bad.mp4") and not ledger.is_done("fine.mp4")
    assert sorted(e["data"]["reason"] for e in ledger.entries()) == [
        "FileNotFoundError: clips/.x.tmp-1.mp4",  # in this run's errors, though redone next run
        "cannot decode",
    ]
    ledger.commit("fine.mp4", [{"clip_id": "c"}])  # the next run redid it
    assert ledger.is_done("fine.mp4")
    assert sorted(e["kind"] for e in ledger.entries()) == ["error", "record"]


def test_two_concurrent_clip_runs_end_with_every_clip_of_one_run(tmp_path, sample_videos):
    """The reported case: two `vidforge clip` runs started together on one folder. One is refused at once
    (exit 2, one line); the other makes every clip, and a later run finds nothing left to do."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("red_square.mp4", "motion_fast.mp4", "motion_slow.mp4"):
        (inputs / name).write_bytes((sample_videos / name).read_bytes())
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "vidforge.cli.app", "clip", str(inputs), "-o", str(out)]
    cmd += ["--set", "curation.embed=false", "--set", "curation.decode_workers=1"]
    env = {**os.environ, "PYTHONPATH": SRC}
    runs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    codes = [p.wait(timeout=120) for p in runs]
    assert sorted(codes) == [0, 2], [p.stderr.read() for p in runs]
    winner, loser = runs if codes[0] == 0 else runs[::-1]
    assert loser.stderr.read().strip().splitlines() == [
        f"error: {out}: vidforge pid {winner.pid} is writing this folder; wait for it to finish or pass "
        "another output folder"
    ]
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) >= 3 and all((out / r["path"]).is_file() for r in manifest)
    assert (out / "errors.jsonl").read_text() == ""
    again = CliRunner().invoke(
        app, ["--json", "clip", str(inputs), "-o", str(out), "--set", "curation.embed=false"]
    )
    assert again.exit_code == 0, again.output
    summary = next(json.loads(line) for line in again.stdout.splitlines() if '"result"' in line)
    assert summary["sources_skipped"] == 3
    assert [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()] == manifest


def _stage_args(command: str, inputs: Path, out: Path) -> list[str]:
    return (
        [command, "--data", str(inputs), "--run-dir", str(out)]
        if command == "train"
        else [command, str(inputs), "-o", str(out)]
    )


_INPUTS = {
    "clip": None,
    "caption": "clips",
    "shard": "captioned",
    "tokenize": "shards",
    "train": "latents",
}


def _inputs(command: str, tmp_path: Path, sample_videos: Path) -> Path:
    if command == "clip":
        return sample_videos / "red_square.mp4"
    path = tmp_path / _INPUTS[command]
    _prepare_input(command, path, sample_videos)
    return path


@pytest.mark.parametrize("command", ["clip", "caption", "shard", "tokenize", "train"])
def test_a_lock_file_planted_as_a_symbolic_link_is_refused_and_its_target_untouched(
    tmp_path, sample_videos, command
):
    """Issue 38, point 2: `ln -s SOMEFILE OUT/.lock` made every stage truncate SOMEFILE and write its pid
    into it (the lock was opened `a+`, following the link)."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(victim)
    result = CliRunner().invoke(app, _stage_args(command, _inputs(command, tmp_path, sample_videos), out))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {out / LOCK} is a symbolic link (a stage keeps to its own folders); remove it and run again"
    ]
    assert victim.read_text() == "keep me\n"


def test_a_lock_file_planted_as_a_hard_link_or_a_fifo_is_refused(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    for name, plant, what in [
        ("hard", lambda p: os.link(victim, p), "a hard link to another file"),
        ("fifo", os.mkfifo, "not a regular file"),
    ]:
        out = tmp_path / name
        out.mkdir()
        plant(out / LOCK)
        with pytest.raises(UserInputError, match=f"^{out / LOCK} is {what} "):
            FolderLock(out)
    assert victim.read_text() == "keep me\n"


@pytest.mark.parametrize(
    "command, where, name",
    [
        ("clip", "out", "clips"),
        ("caption", "out", "clips"),
        ("caption", "in", "clips"),  # caption reads the clip stage's output by the clip stage's rule
        ("train", "out", "checkpoints"),
    ],
)
def test_a_planted_output_subfolder_link_is_refused_by_every_stage_alike(
    tmp_path, sample_videos, command, where, name
):
    """`ln -s ELSEWHERE OUT/clips` made `clip` write its media outside OUT, which `caption` then refused as
    "resolves outside": the stages disagreed. Now each refuses the link in one line before writing."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    inputs = _inputs(command, tmp_path, sample_videos)
    out = tmp_path / "out"
    folder = out if where == "out" else inputs
    folder.mkdir(exist_ok=True)
    (folder / name).symlink_to(elsewhere, target_is_directory=True)
    args = _stage_args(command, inputs, out)
    result = CliRunner().invoke(app, args + ["--set", "curation.embed=false"] * (command == "clip"))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {folder / name} is a symbolic link (a stage keeps to its own folders); remove it and run again"
    ]
    assert list(elsewhere.iterdir()) == []


def test_infer_refuses_an_output_folder_another_run_writes(tmp_path):
    """Issue 38, point 10: two `infer` runs on one -o both finished, and samples.jsonl kept the last's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from train_fixtures import TRAIN_SETS, train_profile

    from vidforge.models import build_model
    from vidforge.weights.checkpoint import save_model

    export = save_model(build_model(train_profile().model), tmp_path / "export")
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        args = [
            "infer",
            "-c",
            str(export),
            "--profile",
            "local_cpu",
            "--prompt",
            "a red square",
            "-o",
            str(out),
        ]
        for s in TRAIN_SETS:
            args += ["--set", s]
        result = CliRunner().invoke(app, args)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {out}: vidforge pid {proc.pid} is writing this folder; wait for it to finish or pass "
        "another output folder"
    )
    assert not (out / "samples.jsonl").exists()
