"""An LTX-2 LoRA `vidforge finetune` trains, back in diffusers: the adapter folder loads with the call
finetune prints (`LTX2Pipeline.load_lora_weights`), changes the pipeline's video, and the pipeline then
samples the latents `vidforge infer --lora RUN` (the finetune's folder) samples; `vidforge model export --merged` loads in
`LTX2VideoTransformer3DModel.from_pretrained` with the adapted transformer's outputs. The fixture zeroes
the audio-to-video attention's output, so the joint model's video is the video path's (as
tests/unit/test_ltx2_infer.py holds the pipeline's default sampling to)."""

import torch
from default_parity import PROMPT, noise, vidforge_infer
from diffusers import LTX2Pipeline, LTX2VideoTransformer3DModel
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames

HERE = ("cluster.accelerator=cpu", "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0", "data.buckets=[[64,96]]",
        "data.frame_buckets=[9]", "train.precision=fp32")  # fmt: skip
HEIGHT, WIDTH, FRAMES, STEPS = 64, 96, 9, 2
SIZE = [
    f"infer.height={HEIGHT}",
    f"infer.width={WIDTH}",
    f"infer.frames={FRAMES}",
    f"diffusion.steps={STEPS}",
]
RANK, ALPHA = 4, 8  # alpha / rank = 2: a loader that read no alpha would scale the adapter by 1


def _invoke(*args) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output[-3000:]
    return result.output


def _video(transformer, seed: int = 0) -> torch.Tensor:
    """The transformer's video output on one random input (audio isolated; 2 x 2 x 3 latents)."""
    g = torch.Generator().manual_seed(seed)
    x, text = torch.randn(1, 12, 4, generator=g), torch.randn(1, 7, 16, generator=g)
    mask, t = torch.ones(1, 7, dtype=torch.long), torch.tensor([600.0])
    with torch.no_grad():
        video, _ = transformer(
            hidden_states=x, audio_hidden_states=torch.zeros(1, 1, 4), encoder_hidden_states=text,
            audio_encoder_hidden_states=torch.zeros(1, 7, 16), timestep=t, sigma=t,
            encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=2, height=2, width=3,
            fps=24.0, audio_num_frames=1, isolate_modalities=True, return_dict=False,
        )  # fmt: skip
    return video


def test_a_lora_loads_into_the_pipeline_and_samples_as_vidforge_does(
    tmp_path, monkeypatch, ltx2_folder
) -> None:
    folder = ltx2_folder(audio_to_video=False)
    videos = tmp_path / "videos"
    videos.mkdir()
    for i, text in enumerate(("a red square moving right", "a blue square moving left")):
        write_video(videos / f"clip{i}.mp4", synthetic_frames(12, HEIGHT, WIDTH, i), fps=24)
        (videos / f"clip{i}.txt").write_text(text)
    run = tmp_path / "run"
    sets = (*HERE, f"train.lora={{rank: {RANK}, alpha: {ALPHA}}}", "train.lr=0.1")
    output = _invoke(
        "finetune", videos, "--base", folder, "-o", run, "--steps", 1, "--validate-every", 0,
        *[a for s in sets for a in ("--set", s)],
    )  # fmt: skip

    pipe = LTX2Pipeline.from_pretrained(folder)
    plain = _video(pipe.transformer.eval())
    # the call finetune prints to load the adapter in diffusers
    hint = next(line for line in output.splitlines() if "LTX2Pipeline.from_pretrained(" in line)
    assert ").load_lora_weights(" in hint
    eval("pipe" + hint[hint.index(").load_lora_weights(") + 1 :], {"pipe": pipe})
    loaded = [k for k in pipe.transformer.state_dict() if "lora_" in k]
    assert len(loaded) == 2 * 2 * 4 * 2  # lora_A and B on q, k, v, out of self- and cross-attention, 2 blocks
    assert (_video(pipe.transformer) - plain).abs().max() > 1e-3  # the adapter changes it

    ours, _, record = vidforge_infer(
        folder, tmp_path / "out", SIZE, monkeypatch, lora=run
    )  # the run's folder
    assert record["lora"] == str(run.resolve())
    theirs = pipe(
        prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
        latents=pipe._pack_latents(noise(ours.shape[1:])), output_type="latent", return_dict=False,
    )[0]  # fmt: skip
    vae = pipe.vae  # the pipeline returns denormalised latents; vidforge decodes its normalised ones
    ours = pipe._denormalize_latents(ours, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)

    # the adapter folded into its base: a transformer folder diffusers loads, equal to the adapted one
    # the finetune run itself, as README passes it (its adapter is in train/export: files.weights_places)
    _invoke("model", "export", run, "--merged", "-o", tmp_path / "merged" / "transformer")
    merged = LTX2VideoTransformer3DModel.from_pretrained(tmp_path / "merged" / "transformer")
    torch.testing.assert_close(_video(merged.eval()), _video(pipe.transformer.eval()), rtol=1e-5, atol=1e-5)
