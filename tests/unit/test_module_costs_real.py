"""The costs read off the module (one block on the meta device: `models.flops`, `estimate.module_costs`)
against a real CPU forward and backward of the whole model, for every registered family (Wan T2V, I2V
and TI2V's per-token noise levels, the vidforge DiT and ST-DiTs, HunyuanVideo-1.5 T2V and I2V, LTX-2,
and the toy family of test_families): the FLOPs equal FlopCounterMode's count of the real step (dense
attention, as the read counts it), and the bytes saved for the backward (the blocks' x layers, outside
the blocks, the conditioning every block reads) equal the storages autograd saves in the real forward,
SDPA run as the CPU's FlashAttention kernel (the counterpart of the GPU's, whose tensors the meta read
takes). One case of each family by default, every case with VIDFORGE_TEST_ALL_FAMILY_COSTS=1."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from test_families import toy  # noqa: F401  (the toy family's fixture)
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from vidforge.estimate.module_costs import saved_bytes
from vidforge.models import build_model, forward_flops
from vidforge.models.flops import meta_inputs
from vidforge.profile import Model

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "mlp_hidden": 128, "text_dim": 32}
WAN = ("wan2.1-1.3b", SMALL)
HUNYUAN = {**SMALL, "refiner_layers": 1, "text_2_dim": 16, "text_2_tokens": 5, "rope_axes": (4, 6, 6)}
CASES = {
    "wan-t2v": (*WAN, {}),
    "wan-i2v": ("wan2.1-1.3b", {**SMALL, "image_dim": 24, "condition_channels": 8}, {"image": 7}),
    "wan-ti2v": ("wan2.2-ti2v-5b", SMALL, {"token_levels": True}),
    "dit": ("tiny", SMALL, {}),
    "stdit": ("tiny", {**SMALL, "architecture": "stdit"}, {}),
    "stdit-parallel-mm": ("tiny", {**SMALL, "architecture": "stdit", "stdit_block": "parallel-mm"}, {}),
    "hunyuan15-t2v": ("hunyuanvideo1.5-480p-t2v", {**HUNYUAN, "image_dim": 16}, {"image": 6}),
    "hunyuan15-i2v": ("hunyuanvideo1.5-480p-i2v", {**HUNYUAN, "image_dim": 16}, {"image": 6}),
    "ltx2": ("ltx-2", {**{k: v for k, v in SMALL.items() if k != "mlp_hidden"}, "in_channels": 8}, {}),
    "toy": ("toy-1", {"text_dim": 32, "in_channels": 8}, {}),
}
GRID = (3, 6, 10)  # a 16:9-ish clip's token grid
TEXT = 9


PHILOX = 16 + 8
"""Bytes of the random-number seed and offset the GPU's FlashAttention saves a call (the meta read's)."""


class _FlashOnCpu(TorchFunctionMode):
    """SDPA as the CPU's FlashAttention kernel (q, k, v, output and a float32 log-sum-exp saved), a
    boolean mask as the additive one that kernel takes; counts the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.masks = 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            if mask is not None and mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
                self.masks.append(mask)  # the kernel's form of the model's mask: not the model's
            self.calls += 1
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, bool(kwargs.get("is_causal", False)), attn_mask=mask, scale=kwargs.get("scale")
            )[0]
        return func(*args, **kwargs)


def _real_inputs(cfg, image: int, token_levels: bool):
    """`meta_inputs`' shapes as random CPU tensors (noise levels in [0, 1])."""
    args, keywords = meta_inputs(cfg, (GRID,), False, TEXT, image, token_levels, torch.float32)
    real = [torch.rand(a.shape) if i == 1 else torch.randn(a.shape) for i, a in enumerate(args)]
    return real, {k: torch.randn(v.shape) for k, v in keywords.items()}


def _saved_storages(model, args, keywords) -> tuple[int, int]:
    """Bytes of the distinct storages autograd saves in a real forward, parameters excluded, and the
    attention calls it made."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _FlashOnCpu() as flash:
        model(*args, **keywords)
    for mask in flash.masks:
        saved.pop(mask.untyped_storage().data_ptr(), None)
    return sum(saved.values()), flash.calls


def _config(case: str):
    preset, fields, extra = CASES[case]
    return (
        Model.model_validate({"preset": preset, **fields}),
        extra.get("image", 0),
        extra.get("token_levels", False),
    )


DEFAULT = ("wan-i2v", "stdit-parallel-mm", "hunyuan15-i2v", "ltx2", "toy")
"""One case of each registered family by default; every case with VIDFORGE_TEST_ALL_FAMILY_COSTS=1."""
ALL = os.environ.get("VIDFORGE_TEST_ALL_FAMILY_COSTS") == "1"


@pytest.fixture(params=[c for c in CASES if ALL or c in DEFAULT])
def case(request):
    if request.param == "toy":
        request.getfixturevalue("toy")
    return request.param


def test_flops_and_bytes_read_off_one_block_equal_the_real_step(case) -> None:
    cfg, image, levels = _config(case)
    torch.manual_seed(0)
    model = build_model(cfg)
    args, keywords = _real_inputs(cfg, image, levels)
    real, calls = _saved_storages(model, args, keywords)
    read = saved_bytes(cfg, (GRID,), False, TEXT, image, levels, torch.float32)
    assert cfg.layers * read.block() + read.outside + read.shared == real + PHILOX * calls

    dense = cfg.model_copy(update={"attention": "dense"})  # QK^T and PV as the matmuls they count
    model = build_model(dense)
    with FlopCounterMode(display=False) as counter:
        model(*args, **keywords).float().square().mean().backward()
    flops = forward_flops(dense, [GRID], TEXT, [image] if cfg.image_dim else None, levels)
    assert flops.train_step() == counter.get_total_flops() > 0


def test_hunyuan15_block_bytes_at_a_480p_clip_equal_the_real_forwards() -> None:
    """HunyuanVideo-1.5 (its published head width, 128) on a 480p 16:9 clip's token grid (848 x 480 after
    the VAE's 16x: 30 x 53, two latent frames), image-to-video: the block's bytes read off the module
    equal what a real CPU forward saves, block for block (the model less its one block)."""
    fields = {**HUNYUAN, "hidden": 256, "heads": 2, "mlp_hidden": 1024, "rope_axes": (16, 56, 56)}
    cfg = Model.model_validate({"preset": "hunyuanvideo1.5-480p-i2v", **fields, "image_dim": 16})
    grid = (2, 30, 53)
    args, keywords = meta_inputs(cfg, (grid,), False, TEXT, 6, False, torch.float32)
    args = [torch.rand(a.shape) if i == 1 else torch.randn(a.shape) for i, a in enumerate(args)]
    keywords = {k: torch.randn(v.shape) for k, v in keywords.items()}
    totals = []
    for layers in (1, 2):
        torch.manual_seed(0)
        model = build_model(cfg.model_copy(update={"layers": layers}))
        real, calls = _saved_storages(model, args, keywords)
        totals.append(real + PHILOX * calls)
    read = saved_bytes(cfg, (grid,), False, TEXT, 6, False, torch.float32)
    assert totals[1] - totals[0] == read.block() > 0
    assert totals[0] == read.block() + read.outside + read.shared
