"""Costs read off the module at the shapes users run (a 14B model at 81 frames of 480p, 32760 tokens),
on the meta device: Wan2.1-14B's FLOPs against the closed form of its block; the bytes a block saves
linear in a rank's tokens, and one tensor-parallel rank's shard of them. (test_module_costs_real holds
both reads to a real CPU forward and backward of every family.)"""

import pytest
import torch

from vidforge.estimate.module_costs import saved_bytes, saved_per_rank
from vidforge.models import forward_flops, model_config

GRID = (21, 30, 52)  # 81 frames of 832 x 480 after the VAE and the 1 x 2 x 2 patch
TEXT = 512


def test_wan14b_flops_equal_the_closed_form_of_its_block():
    cfg = model_config("wan2.1-14b")
    d, m, n, s, c = cfg.hidden, cfg.mlp_hidden, cfg.layers, GRID[0] * GRID[1] * GRID[2], TEXT
    p = cfg.patch_dim
    block = 4 * 2 * s * d * d + 4 * d * s * s  # q, k, v, out; QK^T and PV
    block += 2 * 2 * s * d * d + 2 * 2 * c * d * d + 4 * d * s * c  # cross: q, out; k, v of the caption
    block += 2 * 2 * s * d * m  # feed-forward
    time = 2 * 256 * d + 2 * d * d + 2 * d * 6 * d  # sinusoids -> d -> d, time_proj to 6 vectors
    outside = 2 * s * p * d + time + 2 * c * cfg.text_dim * d + 2 * c * d * d + 2 * s * d * p
    count = forward_flops(cfg, [GRID], TEXT)
    assert count.forward == n * block + outside
    # backward: twice the forward but the patch embedding's, the first layers of the timestep and caption
    # MLPs (no input gradient)
    no_grad = 2 * s * p * d + 2 * 256 * d + 2 * c * cfg.text_dim * d
    assert count.train_step() == 3 * (n * block + outside) - no_grad


@pytest.mark.parametrize("preset", ["wan2.1-14b", "small"])
def test_a_tensor_parallel_rank_keeps_its_share_of_the_split_layers(preset):
    # Wan2.1-14B's plan and the DiT's: what the split layers make (q, k, v, attention, the MLP's inner
    # width) is 1/tp a rank; the stream the column-parallel layers read, and the rest, are whole in the
    # meta run (sequence parallel divides the rest by tp on the rank's tokens: `saved_per_rank`)
    cfg = model_config(preset)
    one, two, four = (
        saved_bytes(cfg, (GRID,), False, TEXT, 0, False, torch.bfloat16, tp=t) for t in (1, 2, 4)
    )
    assert one.sharded == one.gathered == 0 and one.outside == two.outside
    # the split layers' share of the unsplit block: it and the stream add up to the block again
    assert one.block() == pytest.approx(2 * two.sharded + two.gathered + two.stream, rel=0.02)
    # (a norm over the split width keeps one rstd a token on every rank: not quite 1/tp)
    assert two.sharded == pytest.approx(2 * four.sharded, rel=1e-3) and two.sharded > 0
    assert (two.gathered, two.stream) == (four.gathered, four.stream) and two.gathered > 0
    # a block of one rank holds more than 1/tp of the unsplit block: the stream is whole without SP
    tokens = GRID[0] * GRID[1] * GRID[2]
    whole = saved_per_rank(cfg, GRID, 1, False, TEXT, 0, False, 2, tokens).block
    sp = saved_per_rank(cfg, GRID, 1, False, TEXT, 0, False, 2, tokens, tp=2).block
    no_sp = saved_per_rank(
        cfg, GRID, 1, False, TEXT, 0, False, 2, tokens, tp=2, sequence_parallel=False
    ).block
    assert whole / 2 < sp < no_sp < whole


def test_block_bytes_are_linear_in_the_tokens_of_a_rank():
    # context parallel: half the tokens of the clip, the caption's part whole
    cfg = model_config("wan2.1-1.3b")
    tokens = GRID[0] * GRID[1] * GRID[2]
    whole, half, caption = (
        saved_per_rank(cfg, GRID, 1, False, TEXT, 0, False, 2, n).block for n in (tokens, tokens / 2, 0)
    )
    assert caption > 0 and half == pytest.approx((whole + caption) / 2)
    assert whole == saved_per_rank(cfg, GRID, 1, False, TEXT, 0, False, 2, tokens).block


def test_costs_are_read_whatever_the_callers_autograd_mode():
    # a training step counts its FLOPs under no_grad, infer under inference_mode: the meta run still needs
    # autograd (the backward's FLOPs, the saved tensors)
    cfg = model_config("small")
    with torch.inference_mode():
        flops = forward_flops(cfg, [(2, 4, 4)], 5).train_step()
        saved = saved_per_rank(cfg, (2, 4, 4), 1, False, 5, 0, False, 2, 32)
    assert flops == forward_flops(cfg, [(2, 4, 4)], 5).train_step() > 0
    assert saved == saved_per_rank(cfg, (2, 4, 4), 1, False, 5, 0, False, 2, 32) and saved.block > 0
