"""`vidforge infer --image` of a HunyuanVideo-1.5 image-to-video folder without a size samples at the size
HunyuanVideo15ImageToVideoPipeline picks for the image (its bucket closest to the image's aspect; the
pipeline takes no size), a portrait image and a landscape one; a size the user gives is kept."""

import numpy as np
import torch
from default_parity import PROMPT, noise, vidforge_infer
from diffusers import HunyuanVideo15ImageToVideoPipeline
from hunyuan15_fixtures import save_tiny_pipeline
from PIL import Image

FRAMES, STEPS = 5, 2
SETS = [f"infer.frames={FRAMES}", f"diffusion.steps={STEPS}"]


def _picture(path, width: int, height: int):
    y, x = np.mgrid[0:height, 0:width]
    Image.fromarray(np.stack([x * 2, y * 2, (x * y) % 251], axis=-1).astype(np.uint8)).save(path)
    return path


def test_infer_samples_at_the_size_the_i2v_pipeline_picks_for_the_image(tmp_path, monkeypatch) -> None:
    from vidforge.infer.image_condition import image_size_sets
    from vidforge.infer.weights import find_weights, sampling_profile

    folder = save_tiny_pipeline(tmp_path / "pipeline", task="i2v")
    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(folder)
    prof = sampling_profile(find_weights(folder), SETS)
    picked = {}
    # 1:4 and 4:1, whose buckets (32 x 128, 128 x 32) the tiny transformer's 2 x 2 patches divide
    for name, (width, height) in {"portrait": (30, 120), "landscape": (120, 30)}.items():
        image = _picture(tmp_path / f"{name}.png", width, height)
        theirs = pipe.video_processor.calculate_default_height_width(height, width, pipe.target_size)
        sets = {o.key: o.value for o in image_size_sets(prof, image, SETS)}
        picked[name] = (sets["infer.height"], sets["infer.width"])
        assert picked[name] == theirs, name
        assert image_size_sets(prof, image, [*SETS, "infer.width=64"]) == []  # the user's size is kept
    assert picked["portrait"][0] > picked["portrait"][1] and picked["landscape"][0] < picked["landscape"][1]

    # the whole run: the portrait's video at the pipeline's size, its latents the pipeline's
    image = tmp_path / "portrait.png"
    ours, _, _ = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch, image=image)
    height, width = picked["portrait"]
    assert ours.shape[3:] == (height // 16, width // 16)
    theirs = pipe(
        image=Image.open(image), prompt=PROMPT, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)
