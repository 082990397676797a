"""`vidforge infer` of a HunyuanVideo-1.5 folder in the published layout (tiny random components of the
real classes) with DEFAULT sampling arguments (`default_parity`: only the size, the steps and the noise
given, to both) samples HunyuanVideo15Pipeline's latents: the folder's flow shift and Euler steps over the
pipeline's schedule, its guider's scale, the encoded empty caption as the negative prompt, both caption
encoders, zeros in the condition channels; and writes 24 fps."""

import torch
from default_parity import PROMPT, noise, vidforge_infer
from diffusers import HunyuanVideo15Pipeline
from hunyuan15_fixtures import GUIDANCE

HEIGHT, WIDTH, FRAMES, STEPS = (
    64,
    96,
    5,
    3,
)  # latents 2 x 4 x 6; the tiny transformer's 2x2 patches: 2 x 2 x 3
SETS = [
    f"infer.height={HEIGHT}",
    f"infer.width={WIDTH}",
    f"infer.frames={FRAMES}",
    f"diffusion.steps={STEPS}",
]


def test_default_infer_equals_the_t2v_pipeline_and_writes_24_fps(
    tmp_path, monkeypatch, hunyuan15_folder
) -> None:
    folder = hunyuan15_folder()
    ours, fps, record = vidforge_infer(folder, tmp_path / "out", SETS, monkeypatch)
    assert (fps, record["negative_prompt"], record["sampler"], record["guidance"]) == (
        24,
        "",
        "flow-euler",
        GUIDANCE,
    )
    theirs = HunyuanVideo15Pipeline.from_pretrained(folder)(
        prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    assert ours.shape == (1, 4, 2, 4, 6)
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)


def test_t2v_weights_sample_from_text_and_i2v_weights_need_an_image() -> None:
    """T2V's condition channels are zeros: no --image, and validation samples; I2V needs the first frame."""
    from vidforge.families import family
    from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
    from vidforge.profile.loading import apply_overrides, validate_profile

    def profile(task: str):
        data: dict = {"model": {"preset": f"hunyuanvideo1.5-480p-{task}"}}
        apply_overrides(
            data, family("hunyuan15").profile_defaults
        )  # what every profile of the family carries
        return validate_profile(data, task)

    t2v, i2v = profile("t2v"), profile("i2v")
    assert sampling_run_problems(t2v, SamplingRun()) == []
    assert sampling_run_problems(t2v, SamplingRun(image=True)) == [
        "--image: this hunyuan15 model samples from text, its condition channels zeros; drop --image"
    ]
    assert sampling_run_problems(i2v, SamplingRun(image=True)) == []
    assert "give the first frame" in sampling_run_problems(i2v, SamplingRun())[0]
