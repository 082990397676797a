"""The hunyuan15 family's network against diffusers' own HunyuanVideo15Transformer3DModel on tiny random
configs: its weights, saved by diffusers' save_pretrained, load by name; the forward equals the reference's
for text-to-video (zero condition, no image) and image-to-video inputs, in float64 and float32."""

import pytest
import torch
from hunyuan15_fixtures import caption, inputs, our_config, reference_out, reference_transformer
from safetensors.torch import load_file

from vidforge.families.hunyuan15.network import HunyuanVideo15Transformer


def _ours(ref, tmp_path, dtype=torch.float64, **overrides):
    """Our network with the weights of the reference's save_pretrained folder, loaded strictly by name."""
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = HunyuanVideo15Transformer(our_config(ref, **overrides)).to(dtype).eval()
    state = load_file(tmp_path / "diffusion_pytorch_model.safetensors")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return model


def _out(model, inp, dtype=torch.float64):
    text, mask = caption(inp)
    cast = {k: v.to(dtype) if v is not None and v.is_floating_point() else v for k, v in inp.items()}
    with torch.no_grad():
        return model(
            cast["x"],
            cast["t"],
            text.to(dtype),
            mask,
            condition=cast["condition"],
            image=cast["image"],
        )


@pytest.mark.parametrize("task", ["t2v", "i2v"])
def test_forward_equals_diffusers_float64(task, tmp_path):
    ref = reference_transformer(task)
    model = _ours(ref, tmp_path)
    inp = inputs(image=task == "i2v")
    expected = reference_out(ref, inp)
    got = _out(model, inp)
    assert got.shape == expected.shape == inp["x"].shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_forward_equals_diffusers_float32(tmp_path):
    ref = reference_transformer("i2v").float()
    model = _ours(ref, tmp_path, torch.float32)
    inp = inputs(image=True, dtype=torch.float32)
    expected = reference_out(
        ref, {k: v.float() if v is not None and v.is_floating_point() else v for k, v in inp.items()}
    )
    torch.testing.assert_close(_out(model, inp, torch.float32), expected, rtol=1e-5, atol=1e-5)


def test_output_depends_on_what_the_reference_reads(tmp_path):
    """The comparison can fail: a padded caption position is ignored, a valid one and the image are read."""
    ref = reference_transformer("i2v")
    model = _ours(ref, tmp_path)
    inp = inputs(image=True)
    base = _out(model, inp)
    padded = dict(inp, mllm=inp["mllm"].clone())
    padded["mllm"][1, -1] += 5.0  # sample 1's last MLLM position is padding
    torch.testing.assert_close(_out(model, padded), base, rtol=1e-12, atol=1e-12)
    read = dict(inp, mllm=inp["mllm"].clone())
    read["mllm"][1, 0] += 5.0
    assert (_out(model, read)[1] - base[1]).abs().max() > 1e-3
    assert (
        _out(
            model,
            dict(
                inp, image=inp["image"] * torch.linspace(0.5, 2, inp["image"].shape[-1], dtype=torch.float64)
            ),
        )[0]
        - base[0]
    ).abs().max() > 1e-3


def test_latents_and_patch_tokens_give_the_same(tmp_path):
    from vidforge.tokens import patchify, token_grid, unpatchify

    ref = reference_transformer("i2v")
    model = _ours(ref, tmp_path)
    inp = inputs(image=True)
    patch = model.config.patch
    text, mask = caption(inp)
    grid = token_grid(tuple(inp["x"].shape[2:]), patch)
    with torch.no_grad():
        tokens = model(
            patchify(inp["x"], patch),
            inp["t"],
            text,
            mask,
            grid=grid,
            condition=patchify(inp["condition"], patch),
            image=inp["image"],
        )
    torch.testing.assert_close(unpatchify(tokens, grid, patch, model.config.in_channels), _out(model, inp))


def test_what_is_not_built_is_refused_in_one_line(tmp_path):
    """Packed rows and caption dropout are not built for this family: refused naming the setting."""
    from vidforge.errors import UserInputError

    ref = reference_transformer()
    model = _ours(ref, tmp_path)
    inp = inputs()
    text, mask = caption(inp)
    with pytest.raises(UserInputError, match="caption_dropout"):
        model(inp["x"], inp["t"], text, mask, drop_text=torch.tensor([True, False]))
    with pytest.raises(UserInputError, match="data.packing"):  # refused before the layout is read
        model(inp["x"], inp["t"], text, mask, layout=object())
