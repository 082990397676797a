"""A frozen base in float8 (`train.lora.fp8_base`): the linear weights LoRA does not train are stored as
float8 e4m3 values with a float32 scale, one per output row or one per weight, and every forward and
backward computes in the compute dtype from the weight dequantized for that one call (musubi-tuner's
`fp8_scaled`, diffusion-pipe's float8 transformer). A 14B Wan base is 13 GiB instead of 26.

The weight is quantized as torchao's float8 storage is (scale = amax / 448, the largest e4m3 value;
values rounded to nearest), with torch's own `float8_e4m3fn` dtype, so it runs wherever torch does (the
CPU tests included) and needs no FP8 tensor cores. Error: e4m3 has 3 mantissa bits, so a weight whose
scaled value is a normal e4m3 number is off by at most 2^-4 of itself; below 2^-6 (subnormals) by at most
half of the step 2^-9 x scale (`max_abs_error`).

The dequantized weight is never saved for the backward: the autograd function keeps the float8 weight
and its scale and dequantizes again for the input's gradient, so no compute-dtype copy of the base lives
through the step. Applied by `vidforge.train.build` after peft gave the model its adapters (peft's LoRA
layers call their `base_layer`, which this replaces) and before any parallelism."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
SUBNORMAL_STEP = 2.0**-9
"""The spacing of e4m3's subnormal values (and below its smallest normal, 2^-6)."""


def quantize(weight: torch.Tensor, scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 values, float32 scale) of `weight`: scale (out, 1) per row or (1, 1) per tensor, amax / 448."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1, keepdim=True) if scaling == "row" else w.abs().amax()
    scale = (amax / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny).reshape(-1, 1)
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`values` (float8, or its bits as uint8) x `scale`, in `dtype`."""
    if values.dtype == torch.uint8:
        values = values.view(E4M3)
    return (values.float() * scale).to(dtype)


def max_abs_error(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The bound each element of `weight` keeps after `quantize`: 2^-4 of itself for normal e4m3 values,
    half a subnormal step (2^-10 x scale) below them."""
    return torch.maximum(weight.float().abs() * 2.0**-4, scale * SUBNORMAL_STEP / 2)


class _Float8Linear(torch.autograd.Function):
    """y = x W^T + b with W dequantized from float8 here and again in the backward (W is frozen: the
    input's gradient is the only one)."""

    @staticmethod
    def forward(ctx, x, values, scale, bias, dtype):  # type: ignore[override]
        ctx.save_for_backward(values, scale)
        ctx.dtype, ctx.x_dtype = dtype, x.dtype
        b = None if bias is None else bias.to(dtype)
        return F.linear(x.to(dtype), dequantize(values, scale, dtype), b)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        values, scale = ctx.saved_tensors
        grad_x = grad.to(ctx.dtype) @ dequantize(values, scale, ctx.dtype)
        return grad_x.to(ctx.x_dtype), None, None, None, None


class Float8BaseLinear(nn.Module):
    """A frozen nn.Linear stored in float8 e4m3 with a float32 scale (`quantize`)."""

    def __init__(self, linear: nn.Linear, scaling: str) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scaling = linear.in_features, linear.out_features, scaling
        values, scale = quantize(linear.weight, scaling)
        # The float8 bits as uint8: FSDP2's mixed precision casts floating-point parameters (float8 is
        # one) to its param_dtype, and leaves integer ones as they are. The scale is a buffer: FSDP
        # neither shards nor casts it (a few KiB a layer).
        self.weight = nn.Parameter(values.view(torch.uint8), requires_grad=False)
        self.register_buffer("weight_scale", scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.compute_dtype = linear.weight.dtype
        """The dtype the base was in: what the layer computes in outside autocast."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else None
        with torch.autocast(x.device.type, enabled=False):
            return _Float8Linear.apply(x, self.weight, self.weight_scale, self.bias, dtype or x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, e4m3 per {self.scaling}"


def fp8_eligible(name: str, module: nn.Module) -> bool:
    """A frozen nn.Linear of a transformer block, where nearly every weight is (adapters train, so they
    are never converted; the embeddings and the final layer are small and keep their precision)."""
    return name.startswith("blocks.") and isinstance(module, nn.Linear) and not module.weight.requires_grad


def apply_fp8_base(model: nn.Module, scaling: str = "row") -> str:
    """Replace every frozen nn.Linear of `model`'s blocks by a `Float8BaseLinear`, in place;
    a note saying how many weights moved to float8."""
    targets = [(name, m) for name, m in model.named_modules() if fp8_eligible(name, m)]
    moved = 0
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Float8BaseLinear(linear, scaling))
        moved += linear.weight.numel()
    return f"fp8 base: {len(targets)} frozen linear layers ({moved:,} weights) in float8 e4m3, scaled per {scaling}"
