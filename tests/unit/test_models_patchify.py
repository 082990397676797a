"""Patchify/unpatchify and packing: inverses of each other, and token order matches positions."""

import pytest
import torch

from vidforge.models import SequenceLayout, pack_latents, patchify, token_grid, unpack_tokens, unpatchify
from vidforge.tokens import grid_positions


@pytest.mark.parametrize("patch", [(1, 2, 2), (2, 2, 2), (1, 1, 1), (2, 1, 3)])
def test_unpatchify_inverts_patchify(patch):
    x = torch.randn(2, 3, 4, 6, 6)
    grid = token_grid(x.shape[2:], patch)
    tokens = patchify(x, patch)
    assert tokens.shape == (2, grid[0] * grid[1] * grid[2], 3 * patch[0] * patch[1] * patch[2])
    assert torch.equal(unpatchify(tokens, grid, patch, 3), x)


def test_patchify_token_holds_its_patch():
    """Token j holds exactly the latent values of the patch at grid position positions[j] (an
    independent slicing of the latent), in (pt, ph, pw, C) order."""
    patch = (2, 2, 3)
    x = torch.randn(1, 2, 4, 4, 6)
    tokens = patchify(x, patch)
    grid = token_grid(x.shape[2:], patch)
    for j, (t, h, w) in enumerate(grid_positions(grid).tolist()):
        block = x[0, :, t * 2 : t * 2 + 2, h * 2 : h * 2 + 2, w * 3 : w * 3 + 3]
        assert torch.equal(tokens[0, j], block.permute(1, 2, 3, 0).reshape(-1))


def test_patchify_rejects_sizes_not_divisible():
    with pytest.raises(ValueError, match="multiple of the patch size"):
        patchify(torch.randn(1, 4, 3, 5, 4), (1, 2, 2))


def test_pack_unpack_roundtrip_and_layout():
    patch = (1, 2, 2)
    latents = [torch.randn(4, 2, 4, 6), torch.randn(4, 3, 2, 2), torch.randn(4, 1, 8, 4)]
    tokens, layout = pack_latents(latents, patch)
    assert layout.grids == ((2, 2, 3), (3, 1, 1), (1, 4, 2))
    assert layout.seqlens == (12, 3, 8)
    assert layout.offsets == (0, 12, 15, 23)
    assert tokens.shape == (1, 23, 16)
    assert layout.cu_seqlens().tolist() == [0, 12, 15, 23]
    for got, want in zip(unpack_tokens(tokens, layout, patch), latents, strict=True):
        assert torch.equal(got, want)


def test_layout_positions_restart_per_sample():
    layout = SequenceLayout(((2, 1, 2), (1, 2, 1)))
    assert layout.positions().tolist() == [
        [0, 0, 0],
        [0, 0, 1],
        [1, 0, 0],
        [1, 0, 1],  # sample 0
        [0, 0, 0],
        [0, 1, 0],  # sample 1 starts again at 0
    ]
    assert layout.sample_index().tolist() == [0, 0, 0, 0, 1, 1]
    assert layout.per_token(torch.tensor([5.0, 7.0])).tolist() == [[5.0, 5.0, 5.0, 5.0, 7.0, 7.0]]


def test_temporal_order_groups_each_position_across_frames():
    layout = SequenceLayout(((3, 1, 2), (2, 1, 1)))
    order = layout.temporal_order()
    positions = layout.positions()[order]
    # Sample 0: position (0,0) at t=0,1,2 then (0,1) at t=0,1,2; sample 1: (0,0) at t=0,1.
    assert order.tolist() == [0, 2, 4, 1, 3, 5, 6, 7]
    assert positions[:, 0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert layout.position_segments().q_lens == (3, 3, 2)
    assert layout.frame_segments().q_lens == (2, 2, 2, 1, 1)


def test_layout_rejects_bad_grids():
    with pytest.raises(ValueError, match="grids\\[1\\]"):
        SequenceLayout(((1, 2, 2), (0, 2, 2)))
