"""`vidforge infer --image` of a HunyuanVideo-1.5 image-to-video folder in the published layout (tiny random
components of the real classes, SigLIP included) with DEFAULT sampling arguments samples
HunyuanVideo15ImageToVideoPipeline's latents on the same noise: the image cropped to the video's size (the
pipeline's resize_mode "crop"; the image is 70 x 60, the size 64 x 64 the pipeline's bucket for it), its
VAE latents in the first latent frame with the mask after them, SigLIP's states of the crop as the image
tokens, both guidance branches conditioned on them."""

import numpy as np
import torch
from default_parity import PROMPT, noise, vidforge_infer
from diffusers import HunyuanVideo15ImageToVideoPipeline
from hunyuan15_fixtures import save_tiny_pipeline
from PIL import Image

SIZE, FRAMES, STEPS = 64, 5, 3  # latents 2 x 4 x 4; the tiny transformer's 2x2 patches: 2 x 2 x 2
SETS = [f"infer.height={SIZE}", f"infer.width={SIZE}", f"infer.frames={FRAMES}", f"diffusion.steps={STEPS}"]


def first_frame(path):
    """A 70 x 60 picture with structure in both directions (a crop that kept the wrong columns shows)."""
    y, x = np.mgrid[0:60, 0:70]
    pixels = np.stack([x * 3.6, y * 4.2, (x * y) % 251], axis=-1).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_default_infer_equals_the_i2v_pipeline(tmp_path, monkeypatch) -> None:
    folder = save_tiny_pipeline(tmp_path / "pipeline", task="i2v")
    image = first_frame(tmp_path / "first.png")
    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(folder)
    picture = Image.open(image)
    assert pipe.video_processor.calculate_default_height_width(60, 70, pipe.target_size) == (SIZE, SIZE)

    ours, fps, record = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch, image=image)
    theirs = pipe(
        image=picture, prompt=PROMPT, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    assert ours.shape == (1, 4, 2, 4, 4) and fps == 24 and record["image"] == str(image)
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)
