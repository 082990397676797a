"""README's LTX-2 recipe at the shape it prints, 512x768 x 121 frames (LTX2Pipeline's default size and
length; 16 x 16 x 24 = 6,144 tokens through the VAE's 8x32x32): `vidforge model import`, `vidforge
finetune --base L` (a LoRA, two optimizer steps) and `vidforge infer -c L --lora RUN/train` on one generated
video and the tiny LTX-2 folder in the published layout (`tests/ltx2_fixtures.py`, conftest's
`ltx2_folder`: the published VAE compression and scheduler at toy widths). Minutes of VAE work at that
size on 2 cores: opt-in, VIDFORGE_TEST_RECIPES=1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipes import assert_trained, finetune, invoke, run_profile, video_facts, write_videos  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("VIDFORGE_TEST_RECIPES") != "1",
    reason="minutes of VAE work: set VIDFORGE_TEST_RECIPES=1 to run README's LTX-2 recipe",
)
RECIPE = ("--set", "data.buckets=[[512,768]]", "--set", "data.frame_buckets=[121]")
TOKENS = ((121 - 1) // 8 + 1) * (512 // 32) * (768 // 32)


@pytest.mark.slow(minutes=6)
def test_readme_ltx2_recipe_imports_trains_and_samples_at_512x768x121(ltx2_folder, tmp_path) -> None:
    base = ltx2_folder()
    invoke("model", "import", str(base), "-o", str(tmp_path / "ltx2_export"))
    assert run_profile(tmp_path / "ltx2_export")["model"]["family"] == "ltx2"

    videos = write_videos(tmp_path / "videos", (124,), 512, 768, fps=24)
    run = tmp_path / "ltx2_lora"
    finetune(videos, base, run, *RECIPE, "--steps", "2", "--validate-every", "0")
    profile = run_profile(run)
    assert profile["data"]["token_budget"] == TOKENS == 6144 and profile["curation"]["fps"] == 24
    assert_trained(run, 2)

    out = tmp_path / "ltx2_samples"
    argv = ["infer", "-c", str(base), "--lora", str(run / "train"), "--prompt", "a cat walks on the grass",
            "-o", str(out), "--set", "diffusion.steps=2", "--set", "cluster.accelerator=cpu"]  # fmt: skip
    invoke(*argv)
    (video,) = out.glob("*.mp4")
    assert video_facts(video) == (24, 121, {(512, 768)})
