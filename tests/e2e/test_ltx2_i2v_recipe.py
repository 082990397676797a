"""README's LTX-2 image-to-video lines at the shape they print, 512x768 x 121 frames: `vidforge finetune
--base L --set diffusion.image_condition=0.5` (a LoRA, two optimizer steps over clips half of which are
conditioned on their first latent frame) and `vidforge infer -c L --lora RUN/train --image PNG`, on one
generated video and the tiny LTX-2 folder in the published layout (`tests/ltx2_fixtures.py`). Minutes of VAE work at that size on 2 cores: opt-in, VIDFORGE_TEST_RECIPES=1."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ltx2_fixtures import save_tiny_pipeline  # noqa: E402

from vidforge.cli.app import app  # noqa: E402
from vidforge.data.media import write_video  # noqa: E402
from vidforge.data.testing import synthetic_frames  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_RECIPES") != "1",
    reason="minutes of VAE work: set VIDFORGE_TEST_RECIPES=1 to run README's LTX-2 image-to-video lines",
)
RECIPE = ("--set", "diffusion.image_condition=0.5", "--set", "data.buckets=[[512,768]]",
          "--set", "data.frame_buckets=[121]")  # fmt: skip
HERE = ("cluster.accelerator=cpu", "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0")  # fmt: skip


def _invoke(argv: list[str]) -> str:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output[-3000:]
    return result.output


@pytest.mark.slow(minutes=6)
def test_readme_ltx2_image_to_video_lines_train_and_sample_at_512x768x121(tmp_path) -> None:
    base = save_tiny_pipeline(tmp_path / "LTX-2")
    videos = tmp_path / "videos"
    videos.mkdir()
    write_video(videos / "clip0.mp4", synthetic_frames(124, 512, 768, 0), fps=24)
    (videos / "clip0.txt").write_text("a red square moving right")
    run = tmp_path / "ltx2_i2v_lora"
    argv = ["finetune", str(videos), "--base", str(base), "-o", str(run), *RECIPE, "--steps", "2",
            "--validate-every", "0"]  # fmt: skip
    _invoke(argv + [a for s in HERE for a in ("--set", s)])
    assert yaml.safe_load((run / "profile.yaml").read_text())["diffusion"]["image_condition"] == 0.5
    steps = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(np.isfinite(s["loss"]) for s in steps)

    picture = tmp_path / "first_frame.png"
    Image.fromarray(synthetic_frames(1, 512, 768, 3)[0]).save(picture)
    out = tmp_path / "ltx2_i2v_samples"
    argv = ["infer", "-c", str(base), "--lora", str(run / "train"), "--image", str(picture), "--prompt",
            "the cat turns its head", "-o", str(out), "--set", "diffusion.steps=2",
            "--set", "cluster.accelerator=cpu"]  # fmt: skip
    _invoke(argv)
    (video,) = out.glob("*.mp4")
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        assert (stream.height, stream.width, frames, float(stream.average_rate)) == (512, 768, 121, 24)
    record = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert record["image"] == str(picture) and record["lora"] == str((run / "train").resolve())
