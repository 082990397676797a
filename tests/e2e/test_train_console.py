"""`vidforge train` into a pipe (cron, CI logs): one whole line per logged step with the step count, no
warning that is not the user's business (a one-process checkpoint), nothing under --quiet; TensorBoard
event files appear."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_fixtures import TRAIN_SETS, make_latents  # noqa: E402


def _train(latents: Path, run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("vidforge")
    args = [str(exe), *flags, "train", "--data", str(latents), "--run-dir", str(run_dir)]
    for item in [*TRAIN_SETS, "train.steps=2", "train.save_every=2"]:
        args += ["--set", item]
    # An earlier --json test in this session may have exported PYTHONWARNINGS=ignore; this test owns it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"} | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)


def test_train_log_lines_are_whole_and_quiet_silences_warnings(tmp_path) -> None:
    latents = make_latents(tmp_path / "data", samples=2)
    loud = _train(latents, tmp_path / "loud")
    assert loud.returncode == 0, loud.stderr[-3000:]
    steps = [line for line in loud.stderr.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    assert all(" MFU " in line and line.endswith("%") for line in steps)  # not wrapped at 80 columns
    assert "Warning" not in loud.stderr  # DCP's "torch.distributed is disabled" on each save: silenced
    assert any(line.startswith("│ final_loss_mean") for line in loud.stdout.splitlines())
    assert list((tmp_path / "loud" / "tensorboard").glob("events.out.tfevents.*"))

    quiet = _train(latents, tmp_path / "quiet", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == "", quiet.stderr[-3000:]
