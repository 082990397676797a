"""`kill -9` of the `clip` driver (issue 23, point 6): its decode and transcode workers, the forkserver and
the resource tracker notice and exit within seconds, instead of sitting blocked (with their memory) for
minutes. The run is its own session, so every process it started can be found and counted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def session_processes(sid: int) -> list[int]:
    """Pids of live processes in session `sid` (zombies, dead but unreaped, excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def test_workers_exit_soon_after_the_driver_is_killed(tmp_path, sample_videos):
    sets = ["curation.decode_workers=2", "curation.transcode_workers=1", "curation.embed=false"]
    cmd = [sys.executable, "-m", "vidforge.cli.app", "clip", str(sample_videos), "-o", str(tmp_path / "out")]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(session_processes(proc.pid)) < 4 and proc.poll() is None:
            time.sleep(0.05)  # driver, forkserver and at least two workers
        before = session_processes(proc.pid)
        assert len(before) >= 4, f"the run should have started its workers: {before}"
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone, as the OOM killer or an operator would
        proc.wait()
        killed_at = time.time()
        while session_processes(proc.pid) and time.time() - killed_at < 10:
            time.sleep(0.1)
        left = session_processes(proc.pid)
        assert left == [], f"{len(left)} of the driver's processes still alive 10 s after it was killed"
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
