"""Costs read off the module at the shapes users run (a 14B model at 81 frames of 480p, 32760 tokens),
on the meta device: Wan2.1-14B's FLOPs against the closed form of its block, and the bytes its block
saves against the memory model's op-by-op count of Wan's block (`block_activations`, itself held to
saved-tensor hooks on real CPU runs by test_bench_memory)."""

import pytest
import torch

from vidforge.estimate.memory_model import block_activations
from vidforge.estimate.module_costs import block_bytes_per_rank
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


@pytest.mark.parametrize("preset", ["wan2.1-14b", "wan2.2-ti2v-5b"])
@pytest.mark.parametrize("compute", [2, 4])
def test_wan_block_bytes_within_one_percent_of_the_op_by_op_count(preset, compute):
    cfg = model_config(preset)
    tokens = GRID[0] * GRID[1] * GRID[2]
    read = block_bytes_per_rank(cfg, GRID, 1, TEXT, 0, cfg.expand_timesteps, compute, tokens)
    counted = block_activations(cfg, tokens, 1, TEXT, compute, per_token_modulation=cfg.expand_timesteps)
    assert read == pytest.approx(counted.total, rel=0.01)


def test_block_bytes_are_linear_in_the_tokens_of_a_rank():
    # context parallel: half the tokens of the clip, the caption's part whole
    cfg = model_config("wan2.1-1.3b")
    tokens = GRID[0] * GRID[1] * GRID[2]
    whole = block_bytes_per_rank(cfg, GRID, 1, TEXT, 0, False, 2, tokens)
    half = block_bytes_per_rank(cfg, GRID, 1, TEXT, 0, False, 2, tokens / 2)
    caption = block_bytes_per_rank(cfg, GRID, 1, TEXT, 0, False, 2, 0)
    assert caption > 0 and half == pytest.approx((whole + caption) / 2)
    assert whole == block_bytes_per_rank(cfg, GRID, 1, TEXT, 0, False, 2, tokens)


def test_costs_are_read_whatever_the_callers_autograd_mode():
    # a training step counts its FLOPs under no_grad, infer under inference_mode: the meta run still needs
    # autograd (the backward's FLOPs, the saved tensors)
    cfg = model_config("small")
    with torch.inference_mode():
        flops = forward_flops(cfg, [(2, 4, 4)], 5).train_step()
        saved = block_bytes_per_rank(cfg, (2, 4, 4), 1, 5, 0, False, 2, 32)
    assert flops == forward_flops(cfg, [(2, 4, 4)], 5).train_step() > 0
    assert saved == block_bytes_per_rank(cfg, (2, 4, 4), 1, 5, 0, False, 2, 32) > 0
