"""HunyuanVideo-1.5's trained weights back in diffusers, from a tiny text-to-video folder in the published
layout (tests/hunyuan15_fixtures.py): a LoRA `vidforge finetune` trains loads into the pipeline's
transformer (`load_lora_adapter`, what `load_lora_weights` runs for pipelines that have it; these have
not) and samples as `vidforge infer --lora` does, and `vidforge model export --merged` loads in
`from_pretrained` with the same outputs; a full fine-tune's loss is the flow objective computed directly
with diffusers' transformer on the same batch, and its exported weights load in `from_pretrained` with
the outputs of vidforge's trained network."""

import json

import pytest
import torch
from default_parity import PROMPT, noise, vidforge_infer
from diffusers import HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel
from hunyuan15_fixtures import caption, inputs, reference_out
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.media import write_video
from vidforge.data.testing import synthetic_frames

HERE = ("cluster.accelerator=cpu", "curation.decode_workers=0", "curation.transcode_workers=0",
        "curation.caption.decode_workers=0", "data.prefetch=0", "data.buckets=[[64,96]]",
        "data.frame_buckets=[9]", "train.precision=fp32")  # fmt: skip
SIZE = ["infer.height=64", "infer.width=96", "infer.frames=5", "diffusion.steps=2"]
RANK, ALPHA = 4, 8  # alpha / rank = 2: a loader that read no alpha would scale the adapter by 1


@pytest.fixture(scope="module")
def base(tmp_path_factory, hunyuan15_folder):
    """(the tiny pipeline folder, a folder of two captioned clips)."""
    root = tmp_path_factory.mktemp("hunyuan15_training")
    folder = hunyuan15_folder()
    videos = root / "videos"
    videos.mkdir()
    for i, text in enumerate(('a shop sign reading "OPEN"', "a blue square moving left")):
        write_video(videos / f"clip{i}.mp4", synthetic_frames(12, 64, 96, i), fps=24)
        (videos / f"clip{i}.txt").write_text(text)
    return folder, videos


def _invoke(*args) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output[-3000:]


def _finetune(base, run, steps: int, *options: str, sets: tuple[str, ...] = ()) -> str:
    folder, videos = base
    sets = [a for s in (*HERE, *sets) for a in ("--set", s)]
    argv = ["finetune", videos, "--base", folder, "-o", run, "--steps", steps, "--validate-every", 0]
    result = CliRunner().invoke(app, [str(a) for a in (*argv, *options, *sets)])
    assert result.exit_code == 0, result.output[-3000:]
    return result.output


def _ours(export) -> torch.nn.Module:
    """vidforge's network of an export folder (its model section and weights)."""
    from safetensors.torch import load_file

    from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer
    from vidforge.families.hunyuan15.weights import read_export

    network = HunyuanVideo15Transformer(read_export(export))
    network.load_state_dict(load_file(export / "model.safetensors"))
    return network.eval()


def _our_out(network, inp) -> torch.Tensor:
    text, mask = caption(inp)
    with torch.no_grad():
        return network(inp["x"], inp["t"], text, mask)


def test_a_lora_loads_into_the_pipeline_and_samples_as_vidforge_does(base, tmp_path, monkeypatch) -> None:
    folder, _ = base
    run = tmp_path / "run"
    output = _finetune(base, run, 1, sets=(f"train.lora={{rank: {RANK}, alpha: {ALPHA}}}", "train.lr=0.01"))

    pipe = HunyuanVideo15Pipeline.from_pretrained(folder)
    inp = inputs(dtype=torch.float32)
    plain = reference_out(pipe.transformer.eval(), inp)
    # the call finetune prints to load the adapter in diffusers (the pipeline has no load_lora_weights)
    hint = next(line for line in output.splitlines() if "HunyuanVideo15Pipeline.from_pretrained(" in line)
    eval("pipe" + hint[hint.index(").transformer.") + 1 :], {"pipe": pipe})
    loaded = [k for k in pipe.transformer.state_dict() if "lora_" in k]
    assert len(loaded) == 2 * 8 * 2 + 2 * 4 * 1  # both streams' q, k, v, out in 2 blocks; the refiner's 4
    assert (reference_out(pipe.transformer, inp) - plain).abs().max() > 1e-3  # the adapter changes it

    ours, _, record = vidforge_infer(folder, tmp_path / "out", SIZE, monkeypatch, lora=run / "train")
    theirs = pipe(
        prompt=PROMPT, height=64, width=96, num_frames=5, num_inference_steps=2,
        latents=noise(ours.shape[1:]), output_type="latent",
    ).frames  # fmt: skip
    assert record["lora"] == str((run / "train").resolve())
    torch.testing.assert_close(ours, theirs, rtol=2e-5, atol=2e-5)

    # the adapter folded into its base: a transformer folder diffusers loads, equal to the adapted one
    _invoke("model", "export", run / "train", "--merged", "-o", tmp_path / "merged" / "transformer")
    merged = HunyuanVideo15Transformer3DModel.from_pretrained(tmp_path / "merged" / "transformer")
    torch.testing.assert_close(
        reference_out(merged.eval(), inp), reference_out(pipe.transformer.eval(), inp), rtol=1e-5, atol=1e-5
    )


def test_full_training_steps_on_the_flow_loss_and_exports_to_diffusers(base, tmp_path, monkeypatch) -> None:
    from vidforge.tokens import unpatchify
    from vidforge.train.loss import DenoisingLoss

    folder, _ = base
    seen = []
    draw = DenoisingLoss.draw

    def recording(self, batch, device, shard_of=None):
        drawn = draw(self, batch, device, shard_of)
        seen.append((batch, drawn))
        return drawn

    monkeypatch.setattr(DenoisingLoss, "draw", recording)
    run = tmp_path / "run"
    _finetune(base, run, 2, "--full", sets=("train.lr=1e-3",))
    monkeypatch.undo()
    steps = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and len(seen) == 2
    assert "  lora: null" in (run / "train" / "profile.yaml").read_text()

    # step 1's loss: the velocity objective computed directly, diffusers' transformer on the clean latents,
    # the noise and the flow time vidforge drew (noise = x + (1 - t) target for x = (1 - t) clean + t noise)
    batch, drawn = seen[0]
    ref = HunyuanVideo15Transformer3DModel.from_pretrained(folder / "transformer").eval()
    grid, patch = drawn.model_kwargs["grid"], ref.config.patch_size
    shape = (1, patch, patch)
    t = drawn.level.double()
    clean = batch.latents.double()
    drawn_noise = unpatchify((drawn.x + (1 - t[:, None, None]) * drawn.target).double(), grid, shape, 4)
    noisy = (1 - t)[:, None, None, None, None] * clean + t[:, None, None, None, None] * drawn_noise
    glyphs = 256  # the pipeline's ByT5 positions at the caption's end
    text, mask = batch.text_emb.double(), batch.text_mask
    mllm, glyph = text[:, :-glyphs], text[:, -glyphs:, : ref.config.text_embed_2_dim]
    direct = reference_out(
        ref.double(),
        {"x": noisy, "condition": None, "t": t, "mllm": mllm, "mllm_mask": mask[:, :-glyphs],
         "glyph": glyph, "glyph_mask": mask[:, -glyphs:], "image": None},
    )  # fmt: skip
    loss = (direct - (drawn_noise - clean)).square().mean().item()
    assert steps[0]["loss"] == pytest.approx(loss, rel=1e-5)

    # the finetune's diffusers export loads with the trained network's outputs, which the steps moved
    exported = HunyuanVideo15Transformer3DModel.from_pretrained(run / "diffusers" / "transformer").eval()
    inp = inputs(dtype=torch.float32, glyphs=glyphs)  # the folder's caption layout: 256 glyph positions
    trained = _our_out(_ours(run / "train" / "export"), inp)
    torch.testing.assert_close(reference_out(exported, inp), trained, rtol=1e-5, atol=1e-5)
    assert (trained - reference_out(ref.float(), inp)).abs().max() > 1e-3
