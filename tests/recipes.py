"""README's recipes run as a user runs them, for the e2e recipe tests (tests/e2e/test_*recipe*.py): generated
videos at a recipe's shape, `vidforge` invoked in-process with the settings this CPU machine needs, and what
a run leaves behind read back (its profile, its optimizer steps, its export, a sampled video). The set-up is
owned here; what each recipe must show stays in its test."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from click.testing import Result
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames

ON_CPU = "cluster.accelerator=cpu"
# Every recipe's profile names a GPU; curation's worker processes only add start-up on a folder of one or
# two videos, and a prefetch thread only competes with the step for this machine's two cores.
HERE = (ON_CPU, "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0")  # fmt: skip
# wan_fixtures' tiny umT5 knows ten words: a caption's tokens fit in 8
WAN_HERE = (*HERE, "text_encoder.max_length=8")
CAPTIONS = ("a red square moving right", "a blue square moving left")


def write_videos(folder: Path, frames: Sequence[int], height: int, width: int, fps: int) -> Path:
    """`folder` with clipI.mp4 (frames[I] generated frames of height x width at `fps`, seed I) beside its
    caption clipI.txt, the captions taking turns from CAPTIONS."""
    folder.mkdir(parents=True)
    for i, n in enumerate(frames):
        write_video(folder / f"clip{i}.mp4", synthetic_frames(n, height, width, i), fps=fps)
        (folder / f"clip{i}.txt").write_text(CAPTIONS[i % len(CAPTIONS)])
    return folder


def invoke(*argv: str, sets: Sequence[str] = (), ok: bool = True) -> Result:
    """`vidforge ARGV --set S ...` in this process; `ok`: it must exit 0 (else the output's tail says why)."""
    result = CliRunner().invoke(app, [*argv, *[a for s in sets for a in ("--set", s)]])
    if ok:
        assert result.exit_code == 0, result.output[-3000:]
    return result


def finetune(
    videos: Path, base: Path, out: Path, *args: str, sets: Sequence[str] = HERE, ok: bool = True
) -> Result:
    """`vidforge finetune VIDEOS --base BASE -o OUT ARGS` with `sets` (this machine's, by default)."""
    return invoke("finetune", str(videos), "--base", str(base), "-o", str(out), *args, sets=sets, ok=ok)


def run_profile(run: Path) -> dict[str, Any]:
    """The profile a finetune run resolved and wrote (RUN/profile.yaml), as plain data."""
    return yaml.safe_load((run / "profile.yaml").read_text())


def exported(run: Path) -> dict[str, Any]:
    """The config.json of a finetune run's export (RUN/train/export)."""
    return json.loads((run / "train" / "export" / "config.json").read_text())


def logged_steps(run: Path) -> list[dict[str, Any]]:
    """The metrics lines a finetune run's training logged (RUN/train/metrics.jsonl)."""
    return [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]


def assert_trained(run: Path, steps: int) -> None:
    """The run logged each of its `steps` optimizer steps, every loss finite."""
    logged = logged_steps(run)
    assert [s["step"] for s in logged] == list(range(1, steps + 1))
    assert all(np.isfinite(s["loss"]) for s in logged), logged


def video_facts(path: Path) -> tuple[float, int, set[tuple[int, int]]]:
    """(frames a second, frames decoded, {(height, width) of every decoded frame}) of a video file."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        sizes = [(f.height, f.width) for f in container.decode(stream)]
        return float(stream.average_rate), len(sizes), set(sizes)


def thinnest_wan21_vae():
    """The thinnest AutoencoderKLWan diffusers builds with Wan2.1's 4x8x8 compression and 4 latent channels
    (one channel wide, no residual blocks): at a recipe's size the VAE's encoding is the test's cost, and
    wan_fixtures' base_dim 8 took 182 s where this takes 28 s (2 loaded cores, 49x480x832)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=1, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=0, temperal_downsample=[False, True, True],
        latents_mean=[0.1, 0.2, -0.1, 0.0], latents_std=[1.5, 2.0, 0.5, 1.0],
    )  # fmt: skip
