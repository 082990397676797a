"""README's LTX-2 image-to-video lines at the shape they print, 512x768 x 121 frames: `vidforge finetune
--base L --set diffusion.image_condition=0.5` (a LoRA, two optimizer steps over clips half of which are
conditioned on their first latent frame) and `vidforge infer -c L --lora RUN/train --image PNG`, on one
generated video and the tiny LTX-2 folder in the published layout (`tests/ltx2_fixtures.py`, conftest's
`ltx2_folder`). Minutes of VAE work at that size on 2 cores: opt-in, VIDFORGE_TEST_RECIPES=1."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipes import assert_trained, finetune, invoke, run_profile, video_facts, write_videos  # noqa: E402

from vidforge.data.testing import synthetic_frames  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_RECIPES") != "1",
    reason="minutes of VAE work: set VIDFORGE_TEST_RECIPES=1 to run README's LTX-2 image-to-video lines",
)
RECIPE = ("--set", "diffusion.image_condition=0.5", "--set", "data.buckets=[[512,768]]",
          "--set", "data.frame_buckets=[121]")  # fmt: skip


@pytest.mark.slow(minutes=6)
def test_readme_ltx2_image_to_video_lines_train_and_sample_at_512x768x121(ltx2_folder, tmp_path) -> None:
    base = ltx2_folder()
    videos = write_videos(tmp_path / "videos", (124,), 512, 768, fps=24)
    run = tmp_path / "ltx2_i2v_lora"
    finetune(videos, base, run, *RECIPE, "--steps", "2", "--validate-every", "0")
    assert run_profile(run)["diffusion"]["image_condition"] == 0.5
    assert_trained(run, 2)

    picture = tmp_path / "first_frame.png"
    Image.fromarray(synthetic_frames(1, 512, 768, 3)[0]).save(picture)
    out = tmp_path / "ltx2_i2v_samples"
    argv = ["infer", "-c", str(base), "--lora", str(run / "train"), "--image", str(picture), "--prompt",
            "the cat turns its head", "-o", str(out), "--set", "diffusion.steps=2",
            "--set", "cluster.accelerator=cpu"]  # fmt: skip
    invoke(*argv)
    (video,) = out.glob("*.mp4")
    assert video_facts(video) == (24, 121, {(512, 768)})
    record = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert record["image"] == str(picture) and record["lora"] == str((run / "train").resolve())
