"""`--nproc N` alone starts N ranks; a user error in the ranks, or a layout N ranks cannot hold, is one
line on stderr and exit 2, as in one process (no launcher traceback, not once per rank)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed


def _vidforge(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("vidforge")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_user_error_in_every_rank_is_one_line_once_exit_2(tmp_path) -> None:
    empty = tmp_path / "latents"
    empty.mkdir()
    proc = _vidforge("train", "--data", str(empty), "--run-dir", str(tmp_path / "run"), "--nproc", "2")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no index.json" in lines[0], proc.stderr
    assert proc.stdout == ""


def test_a_layout_nproc_cannot_hold_is_refused_before_launching(tmp_path) -> None:
    args = ["train", "--data", str(tmp_path), "--run-dir", str(tmp_path / "run"), "--nproc", "2"]
    proc = _vidforge(*args, "--set", "parallel.tp=4")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "tp=4 = 4 does not divide the world size 2" in line and "cluster.cpu_processes=2" in line
