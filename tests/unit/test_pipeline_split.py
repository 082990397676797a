"""Pipeline split, single process: loop-style stage placement, blocks divided evenly, stages that chain
to the whole model (plain batch and packed row), the conditioning kept on every stage, and the identity
behind the last stage's loss. Float64, so stage chains equal the whole model to float64 rounding."""

from __future__ import annotations

import pytest
import torch

from vidforge.models import build_model, model_config, pack_latents, unpatchify
from vidforge.parallel.pipeline import (
    replicated_parameter_names,
    split_model,
    stage_blocks,
    stage_indices,
)

CONDITIONING = ("time_embed.", "text_embed.", "null_text", "shared_modulation.")


def _model(layers=4, arch="dit"):
    cfg = model_config("tiny", layers=layers, architecture=arch, adaln_lora_rank=4, hidden=32, mlp_hidden=64)
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the adaLN-Zero start, so every block changes the output
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def _all_stages(model, pp, vpp):
    """Every stage of the pipeline in stage order, gathered from every rank's split."""
    by_index = {}
    for rank in range(pp):
        for index, stage in zip(stage_indices(rank, pp, vpp), split_model(model, rank, pp, vpp), strict=True):
            by_index[index] = stage
    return [by_index[i] for i in range(pp * vpp)]


def test_stages_are_placed_loop_style():
    assert stage_indices(0, 2, 2) == [0, 2]
    assert stage_indices(1, 2, 2) == [1, 3]
    assert stage_indices(2, 4) == [2]
    with pytest.raises(ValueError, match="pp_rank"):
        stage_indices(2, 2)


def test_blocks_are_divided_evenly_in_order():
    assert stage_blocks(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    with pytest.raises(ValueError, match="3 pipeline stages must divide the 4 layers"):
        stage_blocks(4, 3)


@pytest.mark.parametrize("pp,vpp", [(2, 1), (2, 2), (4, 1)])
def test_each_stage_holds_its_blocks_and_the_conditioning(pp, vpp):
    model = _model(layers=4)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    stages = _all_stages(model, pp, vpp)
    per = 4 // (pp * vpp)
    whole = dict(model.named_parameters())
    names = set()
    for i, stage in enumerate(stages):
        assert list(stage.blocks.keys()) == [str(b) for b in range(i * per, (i + 1) * per)]
        assert (stage.patch_embed is not None) == (i == 0)
        assert (stage.final is not None) == (i == len(stages) - 1)
        for name, p in stage.named_parameters():
            torch.testing.assert_close(p, whole[name], rtol=0, atol=0)  # same names, same values
            assert p.data_ptr() != whole[name].data_ptr()  # copies, not views of the whole model
            names.add(name)
        assert {n for n in replicated_parameter_names(stage)} == {
            n for n in whole if n.startswith(CONDITIONING)
        }
    assert names == set(whole)
    # the whole model is untouched
    assert list(model.blocks.keys()) == ["0", "1", "2", "3"]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["dit", "stdit"])
def test_stages_chained_equal_the_whole_model_on_a_batch(arch):
    model = _model(layers=4, arch=arch)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 2, 4, 4, generator=g, dtype=torch.float64)
    noise = torch.randn(2, generator=g, dtype=torch.float64)
    text = torch.randn(2, 3, 32, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    drop = torch.tensor([False, True])
    grid = (2, 2, 2)
    h = x
    for stage in _all_stages(model, 2, 2):
        h = stage(h, noise_level=noise, text=text, text_mask=mask, drop_text=drop, grid=grid)
    out = unpatchify(h, grid, model.config.patch, 4)
    torch.testing.assert_close(out, model(x, noise, text, mask, drop_text=drop), rtol=1e-12, atol=1e-12)


def test_stages_chained_equal_the_whole_model_on_a_packed_row():
    model = _model(layers=4)
    g = torch.Generator().manual_seed(3)
    latents = [torch.randn(4, *s, generator=g, dtype=torch.float64) for s in [(2, 4, 4), (1, 2, 4)]]
    tokens, layout = pack_latents(latents, model.config.patch)
    noise = torch.randn(2, generator=g, dtype=torch.float64)
    text = torch.randn(2, 3, 32, generator=g, dtype=torch.float64)
    h = tokens
    for stage in _all_stages(model, 4, 1):
        h = stage(h, noise_level=noise, text=text, layout=layout)
    torch.testing.assert_close(h, model(tokens, noise, text, layout=layout), rtol=1e-12, atol=1e-12)
