"""The demo shows what its prompts say: `commands/demo.sh` (the whole pipeline, the default profile with
the demo's settings, CPU) samples each of its three prompts at two seeds, and in every one of the six
videos a blob of the named colour is in most frames and travels the named way by a clear margin. The
tracker that judges it (vidforge.bench.prompt_track: the centroid of the colour's largest connected
patch; the demo sweep ranks configurations by it) is checked itself on the sample generator's own clip
first.

The thresholds, and why: visible in at least 0.6 of the frames (most of them: a blob that is missing
from a frame or two is still the prompt), and travel of at least 0.08 of the frame the named way (the
training squares cross 0.38-0.56 (red, green) and 0.33-0.50 (white) of the frame in the 9 frames, the
catalogue's own clips less: 0.08 asks for motion plainly the named way, beyond the blob's jitter,
while leaving room for a model that moves the blob slower than most clips). Two seeds each, so a lucky
draw cannot pass: all six videos but one must show their prompt, so every prompt shows at one seed at
least. That one: the same code, data and seeds train to the same losses (to 6 digits over 3000 steps)
but land on weights whose float rounding is the CPU's own, and on one CPU (2026-11-29) one seed's white
square came out 0.11 visible where the other CPUs' runs showed it. The demo's measured margin: travel
0.31-0.46, visible 0.89-1.0 (docs/benchmarks.md, Demo sweep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from vidforge.bench.prompt_track import decode, track
from vidforge.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ("a red square moving right", "a green square moving right", "a white square moving down")
MIN_VISIBLE, MIN_TRAVEL = 0.6, 0.08
LIMIT_S = 1800  # the demo's run and the first test that waits for it (pyproject's 900 s is too tight)


def test_tracker_sees_the_training_clip_move_right(sample_videos, sample_truth) -> None:
    # The tracker itself, on the source clip: the red square goes right by 2 px a frame over 48 frames.
    truth = sample_truth["red_square"]
    motion = truth["scenes"][0]["motion"][0]
    tr = track(decode(sample_videos / truth["file"]), "a red square moving right")
    assert tr.visible == 1.0
    assert tr.travel == pytest.approx(motion["speed"] * (truth["frames"] - 1) / truth["width"], abs=0.02)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str]:
    """The demo's output folder and what it printed: one run, as `make demo` runs it, for the tests below.
    Each stage's wall seconds are printed (pytest shows them beside a failure or a timeout: which stage
    took the time), and a run cut short by the tests' timeout takes its stage's processes with it."""
    out = tmp_path_factory.mktemp("demo")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "VIDFORGE": str(Path(sys.executable).with_name("vidforge")),
    }
    stages: list[tuple[str, float]] = []  # (the stage's "== " line, when it came)
    stdout: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(
            ["bash", "commands/demo.sh", str(out)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # bash and the stage it runs: one process group to stop
        )
        limit = threading.Timer(LIMIT_S, os.killpg, (proc.pid, signal.SIGKILL))  # without pytest-timeout too
        limit.start()
        try:
            for line in proc.stdout:
                stdout.append(line)
                if line.startswith("== "):  # a stage begins: "== clip", "== sample videos -> OUT/raw"
                    stages.append((line[3:].split(" -> ")[0].strip(), time.monotonic()))
            proc.wait()
        finally:
            limit.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            print(_stage_seconds(stages, time.monotonic(), started))
        stderr.seek(0)
        assert proc.returncode == 0, (
            f"exit {proc.returncode} after {time.monotonic() - started:.0f} s: " + (stderr.read()[-3000:])
        )
    return out, "".join(stdout)


def _stage_seconds(stages: list[tuple[str, float]], now: float, started: float) -> str:
    """One line: each stage's wall seconds (until the next stage began, or `now`), and the whole run's."""
    ends = [t for _, t in stages[1:]] + [now]
    each = ", ".join(f"{name} {end - t:.0f} s" for (name, t), end in zip(stages, ends, strict=True))
    return f"demo stages: {each}; {now - started:.0f} s in all"


# The demo trains for 3000 steps on one thread; the fixture's run counts against the first test's limit.
@pytest.mark.slow(minutes=8)
@pytest.mark.timeout(LIMIT_S)
def test_demo_writes_each_prompt_twice_and_names_the_contact_sheet(demo) -> None:
    out, stdout = demo
    assert f"contact sheet: {out}/samples/contact_sheet.png" in stdout
    assert (out / "samples" / "contact_sheet.png").stat().st_size > 0
    profile = load_profile(str(out / "train" / "export" / "profile.yaml"))
    videos = sorted((out / "samples").glob("*.mp4"))
    assert [v.name for v in videos] == [
        f"{i:03d}_{p.replace(' ', '-')}.mp4" for i, p in enumerate(PROMPTS * 2)
    ]
    for video in videos:
        assert decode(video).shape == (profile.infer.frames, profile.infer.height, profile.infer.width, 3)
    for run in ("captioned", "train", "samples"):  # the demo's review pages
        assert (out / run / "review" / "index.html").is_file()


@pytest.mark.slow(minutes=8)
@pytest.mark.timeout(LIMIT_S)
def test_demo_samples_show_their_prompts(demo) -> None:
    out, _ = demo
    failures = []
    for video, prompt in zip(sorted((out / "samples").glob("*.mp4")), PROMPTS * 2, strict=True):
        tr = track(decode(video), prompt)
        if tr.visible < MIN_VISIBLE or tr.travel < MIN_TRAVEL:
            failures.append(f"{video.name}: visible {tr.visible:.2f}, travel {tr.travel:+.2f}")
    # one miss leaves every prompt shown at one of its seeds at least
    assert len(failures) <= 1, f"need visible >= {MIN_VISIBLE} and travel >= {MIN_TRAVEL}: {failures}"
