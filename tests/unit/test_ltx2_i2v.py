"""LTX-2 image-to-video. `vidforge infer --image` of an LTX-2 folder in the published layout (tiny random
components of the real classes) with DEFAULT sampling arguments samples LTX2ImageToVideoPipeline's video
latents on the same noise: the image re-compressed as one H.264 frame at the pipeline's CRF 33, resized to
the video's size, its VAE latent the clean first latent frame at timestep 0 while the others are noised and
stepped, CFG 3 with guidance rescale 0.7 over the whole sample's clean estimates (the first frame's
included). Training conditions a `diffusion.image_condition` share of the clips on their own first latent
frame (timestep 0, out of the loss: Lightricks' trainer's first-frame conditioning), held in float64 to
diffusers' transformer on the same inputs; a LoRA step trains it from the CLI. The fixture zeroes the
audio-to-video attention's output, so the joint model's video is the video path's (as test_ltx2_infer)."""

import numpy as np
import pytest
import torch
from default_parity import PROMPT, vidforge_infer
from diffusers import LTX2ImageToVideoPipeline
from PIL import Image

from vidforge.errors import UserInputError

HEIGHT, WIDTH, FRAMES, STEPS = 64, 96, 17, 2  # latents 3 x 2 x 3: 18 tokens, 6 of them the image's
SETS = [
    f"infer.height={HEIGHT}",
    f"infer.width={WIDTH}",
    f"infer.frames={FRAMES}",
    f"diffusion.steps={STEPS}",
]


def first_frame(path, size=(90, 70)):
    """A picture of another size than the video's with structure in both directions (a fit that kept the
    wrong pixels, or skipped the re-compression, shows)."""
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([x * 2.8, y * 3.6, (x * y) % 251], axis=-1).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_default_infer_with_an_image_equals_the_i2v_pipeline(tmp_path, monkeypatch, ltx2_folder) -> None:
    folder = ltx2_folder(False)
    image = first_frame(tmp_path / "first.png")
    ours, fps, record = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch, image=image)
    assert (fps, record["image"], record["guidance"]) == (24, str(image), 3.0)
    pipe = LTX2ImageToVideoPipeline.from_pretrained(folder)  # unmodified: infer's captions are float32 too
    theirs = pipe(
        image=Image.open(image), prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=FRAMES,
        num_inference_steps=STEPS, generator=torch.Generator().manual_seed(0),  # vidforge's seed-0 noise
        output_type="latent", return_dict=False,
    )[0]  # fmt: skip
    vae = pipe.vae  # the pipeline returns denormalised latents; vidforge decodes its normalised ones
    ours = pipe._denormalize_latents(ours, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    assert ours.shape == (1, 4, 3, 2, 3)
    # measured 0 on the first frame, 7e-7 after it (without the re-compression 0.36 on the image latent,
    # lanczos 0.1; the sampler's own first frame in the rescale's standard deviation: 0.014)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def _image_to_video_folder(saved, out):
    """The tiny folder saved as an image-to-video pipeline (model_index.json names
    LTX2ImageToVideoPipeline, as its save_pretrained writes it; the components are the same)."""
    import json
    import shutil

    folder = shutil.copytree(saved, out)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "LTX2ImageToVideoPipeline"}))
    return folder


def test_a_conditioned_lora_step_is_the_transformer_with_a_clean_first_frame_in_float64(
    tmp_path, ltx2_folder
) -> None:
    """An image-to-video folder's profile trains first-frame conditioning; with every clip conditioned, the
    loss of the LoRA-adapted network is diffusers' transformer (the adapters merged into it) run on the
    first latent frame clean at timestep 0 and the rest noised at the clip's time, the squared velocity
    error averaged over the other frames only; its gradient reaches the adapters."""
    from diffusers import LTX2VideoTransformer3DModel

    from vidforge.data.batching import BucketBatch
    from vidforge.diffusion import build_objective
    from vidforge.lora import apply_lora, is_adapter
    from vidforge.train.loss import DenoisingLoss
    from vidforge.weights.weights_folder import find_weights, load_published, published_profile

    folder = _image_to_video_folder(ltx2_folder(), tmp_path / "pipeline")
    published = find_weights(folder).published
    assert published_profile(published, []).diffusion.image_condition == 0.5  # the folder's switch
    profile = published_profile(published, ["diffusion.image_condition=1", "train.lora={rank: 4, alpha: 8}"])
    network = load_published(published, runtime=profile.model).double()
    apply_lora(network, profile.train.lora, torch.float64)
    g = torch.Generator().manual_seed(0)
    adapters = {}
    for name, p in network.named_parameters():
        if is_adapter(name):  # B starts at zero: random adapters, so that the merge below is checked
            p.data = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.2
            adapters[name] = p
    d = profile.diffusion
    loss = DenoisingLoss(build_objective(d), 0.0, (1, 1, 1), 4, 16, d.image_condition)
    clean = torch.randn(2, 4, 3, 2, 3, generator=g, dtype=torch.float64)  # 18 tokens, 6 a frame
    text = torch.randn(2, 7, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    torch.manual_seed(1)
    inputs = loss.draw(BucketBatch(clean, text, mask, [], []), torch.device("cpu"))
    ours = loss.reduce(network(inputs.x, **inputs.model_kwargs), inputs).loss
    ours.backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in adapters.values())

    reference = LTX2VideoTransformer3DModel.from_pretrained(folder / "transformer").double()
    scale = 8 / 4  # alpha / rank
    with torch.no_grad():
        for name, module in reference.named_modules():
            a = adapters.get(f"{name}.lora_A.default.weight")
            if a is not None:
                module.weight += scale * adapters[f"{name}.lora_B.default.weight"] @ a
    torch.manual_seed(1)  # the same draws, in the same order: times, caption dropout, conditioning, noise
    t = inputs.level  # the shifted logit-normal times (test_ltx2_finetune holds them): one normal each
    torch.randn(2), torch.rand(2), torch.rand(2)
    noise = torch.randn(clean.shape, dtype=torch.float64)
    t_b = t[:, None, None, None, None].expand(-1, 1, 3, 1, 1).clone()
    t_b[:, :, 0] = 0.0  # the first latent frame clean
    noisy, target = (1 - t_b) * clean + t_b * noise, noise - clean
    timestep = (t_b * 1000).expand(-1, 1, 3, 2, 3).flatten(1)  # per token: 0 on the first frame's
    with torch.no_grad():
        video, _ = reference(
            hidden_states=noisy.flatten(2).transpose(1, 2), audio_hidden_states=torch.zeros(2, 1, 4).double(),
            encoder_hidden_states=text, audio_encoder_hidden_states=torch.zeros(2, 7, 16).double(),
            timestep=timestep, audio_timestep=t * 1000, sigma=t * 1000, encoder_attention_mask=mask.long(),
            audio_encoder_attention_mask=mask.long(), num_frames=3, height=2, width=3, fps=24.0,
            audio_num_frames=1, isolate_modalities=True, return_dict=False,
        )  # fmt: skip
    error = (video.transpose(1, 2).unflatten(2, (3, 2, 3)) - target).square()
    direct = error[:, :, 1:].mean()  # the first frame is out of the loss
    torch.testing.assert_close(ours.detach(), direct, rtol=1e-10, atol=1e-12)
    assert not torch.isclose(direct, error.mean(), rtol=1e-3)


def test_the_first_latent_frame_is_the_images_and_contradictions_are_refused_at_load(
    tmp_path, ltx2_folder
) -> None:
    """Training conditions on a clip's own first latent frame (tokenize stores nothing more): LTX-2's
    causal VAE encodes it from the first pixel frame alone, so it is the latent `infer --image` starts from.
    A profile that turns first-frame conditioning off for LTX-2, or trains it where it cannot run, is
    refused at load in one line; sampling from an image is refused where sampling from text is."""
    from vidforge.profile import ProfileError
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
    from vidforge.profile.loading import apply_override, validate_profile
    from vidforge.tokenizers import build_tokenizer
    from vidforge.weights.weights_folder import find_weights, published_profile

    folder = ltx2_folder()
    profile = published_profile(find_weights(folder).published, [])
    assert profile.diffusion.image_condition == 0  # a text-to-video folder trains text-to-video
    tokenizer = build_tokenizer(profile)
    clip = torch.rand(1, 3, FRAMES, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents, image = tokenizer.encode(clip), tokenizer.encode(clip[:, :, :1])
    torch.testing.assert_close(latents[:, :, :1], image, rtol=1e-5, atol=1e-5)  # 1.6e-7 measured

    def load(*sets):
        data: dict = {"model": {"preset": "ltx-2"}}
        for item in ("diffusion.objective=flow", "data.packing=false", "diffusion.caption_dropout=0", *sets):
            apply_override(data, item)
        return validate_profile(data, "ltx2")

    assert load("diffusion.image_condition=0.5").model.expand_timesteps
    # sampling from an image is refused where sampling from text is: LTX-2.3's STG, several processes
    assert sampling_run_problems(load(), SamplingRun(image=True)) == []
    (stg,) = sampling_run_problems(load("model.perturbed_attention=true"), SamplingRun(image=True))
    (nproc,) = sampling_run_problems(load(), SamplingRun(world=2, image=True))
    assert stg.startswith("model.perturbed_attention:") and nproc.startswith("--image: image-conditioned")
    for sets, says in [
        (["model.expand_timesteps=false"], "model.expand_timesteps: only the wan family has it (the ltx2"),
        (["diffusion.image_condition=0.5", "diffusion.objective=edm"], "diffusion.image_condition: needs"),
    ]:
        with pytest.raises(UserInputError) as refused:
            load(*sets)
        assert isinstance(refused.value, ProfileError) and says in str(refused.value)
        assert "\n" not in str(refused.value)
