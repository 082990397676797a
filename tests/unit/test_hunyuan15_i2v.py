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
from hunyuan15_fixtures import inputs, reference_out
from PIL import Image

SIZE, FRAMES, STEPS = 64, 5, 3  # latents 2 x 4 x 4; the tiny transformer's 2x2 patches: 2 x 2 x 2
SETS = [f"infer.height={SIZE}", f"infer.width={SIZE}", f"infer.frames={FRAMES}", f"diffusion.steps={STEPS}"]


def first_frame(path):
    """A 70 x 60 picture with structure in both directions (a crop that kept the wrong columns shows)."""
    y, x = np.mgrid[0:60, 0:70]
    pixels = np.stack([x * 3.6, y * 4.2, (x * y) % 251], axis=-1).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_default_infer_equals_the_i2v_pipeline(tmp_path, monkeypatch, hunyuan15_folder) -> None:
    folder = hunyuan15_folder("i2v")
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


def _first_frames(run) -> dict[str, np.ndarray]:
    """Each clip's first frame as tokenize fits it to its bucket, by key."""
    from vidforge.data.shard_index import read_index
    from vidforge.data.shard_reader import check_shard
    from vidforge.profile import load_profile
    from vidforge.tokenizers.tokenize import prepare

    data = load_profile(run / "profile.yaml").data
    index = read_index(run / "shards")
    frames = {}
    for entry in index.shards:
        path = index.path(entry)
        for sample in check_shard(path, entry, "sha256"):
            prepared = prepare(path, sample, data)
            frames[prepared.key] = prepared.video[0]
    return frames


def test_finetune_keeps_the_pipelines_image_conditioning_and_trains_a_lora_step(
    tmp_path, monkeypatch, hunyuan15_folder
) -> None:
    """tokenize keeps each clip's condition latents and SigLIP states as the I2V pipeline computes them on its
    first frame; LoRA trains a step that reads them."""
    import io
    import json
    import tarfile

    from test_hunyuan15_finetune import HERE
    from typer.testing import CliRunner

    from vidforge.cli.app import app
    from vidforge.data.batching import CONDITION, IMAGE_EMB
    from vidforge.data.media import write_video
    from vidforge.data.testing import synthetic_frames
    from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer

    folder = hunyuan15_folder("i2v")
    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(2):
        write_video(videos / f"clip{i}.mp4", synthetic_frames(12, 64, 96, i), fps=24)
        (videos / f"clip{i}.txt").write_text(f"a square moving, take {i}")
    seen: list[dict] = []
    forward = HunyuanVideo15Transformer.forward

    def recording(self, x, *args, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("condition", "image", "grid")})
        return forward(self, x, *args, **kwargs)

    monkeypatch.setattr(HunyuanVideo15Transformer, "forward", recording)
    run = tmp_path / "run"
    argv = [
        "finetune",
        str(videos),
        "--base",
        str(folder),
        "-o",
        str(run),
        "--steps",
        "1",
        "--validate-every",
        "0",
    ]
    sets = (*HERE, "train.lr=0.01")  # a step that moves the adapter visibly
    result = CliRunner().invoke(app, argv + [a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output[-3000:]
    monkeypatch.undo()
    steps = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and np.isfinite(steps[0]["loss"])
    assert "--image" in result.output  # the next step samples from a first frame
    assert "HunyuanVideo15ImageToVideoPipeline.from_pretrained(" in result.output
    assert ".transformer.load_lora_adapter(" in result.output  # the loader its pipeline has

    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(folder)
    firsts = _first_frames(run)
    stored = {}
    with tarfile.open(run / "latents" / "train-000000.tar") as tar:
        for member in tar.getmembers():
            key, _, suffix = member.name.partition(".")
            if f"{suffix}" in (CONDITION, IMAGE_EMB):
                stored.setdefault(key, {})[suffix] = np.load(io.BytesIO(tar.extractfile(member).read()))
    assert sorted(stored) == sorted(firsts)
    for key, frame in firsts.items():
        picture = Image.fromarray(frame)
        with torch.no_grad():
            latents = torch.zeros(1, 4, 3, 4, 6)  # 9 frames of 64 x 96
            condition, mask = pipe.prepare_cond_latents_and_mask(
                latents, picture, 1, 64, 96, torch.float32, "cpu"
            )
            embeds = pipe.encode_image(picture, 1, "cpu", torch.float32)
        torch.testing.assert_close(
            torch.from_numpy(stored[key][CONDITION]),
            torch.cat([condition, mask], dim=1)[0],
            rtol=1e-5,
            atol=1e-5,
        )
        torch.testing.assert_close(  # stored as float16, as the captions are
            torch.from_numpy(stored[key][IMAGE_EMB]).float(), embeds[0], rtol=2e-3, atol=2e-3
        )
    trained = [call for call in seen if call["grid"] is not None]
    assert trained and all(call["condition"] is not None and call["image"] is not None for call in trained)
    embeddings = [torch.from_numpy(s[IMAGE_EMB]).float() for s in stored.values()]
    assert any(torch.equal(trained[0]["image"][0].float(), e) for e in embeddings)

    image = first_frame(tmp_path / "first.png")
    ours, _, _ = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch, image=image, lora=run / "train")
    probe = inputs(image=True, dtype=torch.float32)
    plain = reference_out(pipe.transformer.eval(), probe)
    pipe.transformer.load_lora_adapter(
        str(run / "train" / "export"), weight_name="pytorch_lora_weights.safetensors", prefix="transformer"
    )
    assert (reference_out(pipe.transformer, probe) - plain).abs().max() > 1e-3  # the adapter changes it
    theirs = pipe(
        image=Image.open(image), prompt=PROMPT, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)
