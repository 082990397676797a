"""`vidforge infer` of an LTX-2 folder in the published layout (tiny random components of the real
classes) with DEFAULT sampling arguments (`default_parity`: only the size, the steps and the noise given,
to both) samples LTX2Pipeline's video latents: its Euler steps over linspace(1, 1/steps, steps) shifted
by the token count's e^mu and stretched to shift_terminal, its CFG 3 on clean estimates with guidance
rescale 0.7, the encoded empty caption as the negative prompt, Gemma 3 through the text connector; and
writes 24 fps. vidforge hands the network the connector's float32 captions, as the pipeline does (not the
float16 that training's shards store). The pipeline's joint model is the video path here because the fixture zeroes the
audio-to-video attention's output (its modality guidance is then a no-op, as the video path has no
audio), and its default STG changes nothing on a transformer without perturbed_attn; audio is refused."""

import pytest
import torch
from default_parity import PROMPT, noise, vidforge_infer
from diffusers import LTX2Pipeline
from ltx2_fixtures import save_tiny_pipeline

from vidforge.errors import UserInputError

HEIGHT, WIDTH, FRAMES, STEPS = 64, 96, 9, 3  # latents 2 x 2 x 3: 12 tokens (mu far below base_shift's)
SETS = [
    f"infer.height={HEIGHT}",
    f"infer.width={WIDTH}",
    f"infer.frames={FRAMES}",
    f"diffusion.steps={STEPS}",
]


def test_default_infer_equals_the_pipelines_video_and_writes_24_fps(tmp_path, monkeypatch) -> None:
    folder = save_tiny_pipeline(tmp_path / "pipeline", audio_to_video=False)
    ours, fps, record = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch)
    assert (fps, record["negative_prompt"], record["sampler"], record["guidance"]) == (
        24,
        "",
        "flow-euler",
        3.0,
    )
    pipe = LTX2Pipeline.from_pretrained(folder)
    latents = pipe._pack_latents(noise(ours.shape[1:]))  # packed: the pipeline normalises 5-D latents
    theirs = pipe(
        prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=latents, output_type="latent", return_dict=False,
    )[0]  # fmt: skip
    vae = pipe.vae  # the pipeline returns denormalised latents; vidforge decodes its normalised ones
    ours = pipe._denormalize_latents(ours, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    assert ours.shape == (1, 4, 2, 2, 3)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)  # float16 captions: 1e-4


def test_a_folders_profile_samples_with_the_pipelines_call_defaults(tmp_path) -> None:
    """Size, frames, steps, frame rate, guidance and its rescale: `LTX2Pipeline.__call__`'s defaults (its
    num_frames None means 121 for a checkpoint without a duration head)."""
    import inspect

    from vidforge.weights.weights_folder import find_weights, published_profile

    folder = save_tiny_pipeline(tmp_path / "pipeline")
    call = {k: p.default for k, p in inspect.signature(LTX2Pipeline.__call__).parameters.items()}
    prof = published_profile(find_weights(folder).published, [])
    assert (prof.infer.height, prof.infer.width, prof.diffusion.steps) == (
        call["height"], call["width"], call["num_inference_steps"],
    )  # fmt: skip
    assert (prof.infer.frames, call["num_frames"]) == (121, None)
    assert (prof.infer.fps, prof.diffusion.guidance, prof.diffusion.guidance_rescale) == (
        call["frame_rate"], call["guidance_scale"], call["guidance_rescale"],
    )  # fmt: skip


def test_audio_and_ltx23_stg_are_refused_in_one_line() -> None:
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
    from vidforge.profile.loading import apply_override, validate_profile

    def profile(**model):
        data: dict = {"model": {"preset": "ltx-2", **model}}
        for item in ("diffusion.objective=flow", "data.packing=false", "diffusion.caption_dropout=0"):
            apply_override(data, item)
        return validate_profile(data, "ltx2")

    assert sampling_run_problems(profile(), SamplingRun()) == []
    (problem,) = sampling_run_problems(profile(perturbed_attention=True), SamplingRun())
    assert problem.startswith("model.perturbed_attention: this LTX-2.3 model's pipeline samples with")
    with pytest.raises((UserInputError, ValueError), match="audio: LTX-2's audio stream is not built"):
        profile(audio=True)


def test_the_schedule_is_the_schedulers_at_every_size_and_rescale_is_diffusers() -> None:
    """flow_sigmas by the token rule and shift_terminal equal FlowMatchEulerDiscreteScheduler's sigmas as
    the pipeline sets them (its calculate_shift's mu) from 12 tokens to 121 frames at 720p; `guided` with
    a rescale equals diffusers' rescale_noise_cfg of the guided estimate."""
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, rescale_noise_cfg
    from ltx2_fixtures import SCHEDULER

    from vidforge.diffusion.flow import token_shift
    from vidforge.diffusion.flow_samplers import flow_sigmas
    from vidforge.diffusion.guidance import guided

    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    for tokens, steps in [(12, 3), (1024, 30), (6144, 30), (16 * 22 * 40, 40)]:
        mu = calculate_shift(tokens, 1024, 4096, 0.95, 2.05)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        ours = flow_sigmas(steps, token_shift((1024, 0.95, 4096, 2.05), tokens), end=0.0, terminal=0.1)
        torch.testing.assert_close(ours.float(), scheduler.sigmas, rtol=1e-6, atol=1e-6)
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(2, 4, 2, 3, 5, generator=g), torch.randn(2, 4, 2, 3, 5, generator=g)
    theirs = rescale_noise_cfg(uncond + 3.0 * (cond - uncond), cond, guidance_rescale=0.7)
    torch.testing.assert_close(guided(cond, uncond, 3.0, 0.7), theirs, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(guided(cond, uncond, 3.0), theirs)
