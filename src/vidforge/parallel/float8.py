"""FP8 training of the linear layers with torchao's float8: the matmuls of the converted nn.Linear layers
run in float8 on the GPU's FP8 tensor cores; weights, gradients and optimizer states stay in high
precision (the frozen LoRA base's storage in float8 is another thing: `vidforge.memory_savers.fp8_base`).

Scaling (`train.fp8_recipe`): `rowwise` (the default) scales each row of the input and each output row of
the weight on its own (each gradient matmul along its own contraction), with scales rounded down to
powers of two, so one outlier token or channel costs only its row's precision (torchao's and torchtitan's
recipe for accuracy); `tensorwise` takes one scale per tensor, the fastest kernel, and the outliers of any
row set every row's step.

Applied from outside the model, in torchtitan's order: right after the model is built, before
activation checkpointing, torch.compile and FSDP2 (the checkpoint wrapper and FSDP then wrap the
Float8Linear modules as they would the nn.Linear ones). torchao gives speed only with torch.compile on
H100/H200-class GPUs (compute capability >= 8.9) and on large matmuls; on the tiny model it gives nothing.

The float8 matmul (`torch._scaled_mm`) needs its contraction dimension to be a multiple of 16. A layer's
features are checked once (`float8_eligible`), but the weight gradient contracts over the tokens, whose
count changes from batch to batch: a packed row's caption tokens (29 real ones in the GPU suite's first
step, the cross-attention's key and value projections), the per-sample modulation (one row a sample), a
video whose latents are not a multiple of 16 tokens. torchao pads that dimension with zeros
(`pad_inner_dim`): zero rows add nothing to the sums, and the tensorwise scales are taken before the pad,
so the result is the unpadded one's, at the cost of a copy when the count is not a multiple of 16."""

from __future__ import annotations

import dataclasses
import importlib.util

import torch
from torch import nn

from vidforge.errors import UserInputError

MIN_CAPABILITY = (8, 9)
# The last projection back to latent channels stays in high precision (its output is the prediction).
SKIPPED_PREFIXES = ("final.",)


def check_float8_available(device: torch.device) -> None:
    """Refuse `train.fp8=true` where it cannot run: without torchao or off an FP8-capable CUDA GPU."""
    if importlib.util.find_spec("torchao") is None:
        raise UserInputError(
            "train.fp8: needs torchao (pip install 'vidforge[gpu]' or pip install torchao); set train.fp8=false"
        )
    if device.type != "cuda":
        raise UserInputError(
            f"train.fp8: FP8 linear layers need a CUDA GPU with compute capability >= 8.9 (H100, H200, L40S, "
            f"RTX 4090); this run is on {device.type}; set train.fp8=false"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        raise UserInputError(
            f"train.fp8: FP8 linear layers need compute capability >= 8.9, this GPU "
            f"({torch.cuda.get_device_name(device)}) has {capability[0]}.{capability[1]}; set train.fp8=false"
        )


def float8_eligible(module: nn.Module, fqn: str) -> bool:
    """torchao's float8 matmul needs both dims divisible by 16; the final layer is kept in high precision."""
    if fqn.startswith(SKIPPED_PREFIXES) or fqn in {p.rstrip(".") for p in SKIPPED_PREFIXES}:
        return False
    if isinstance(module, nn.Linear):
        return module.in_features % 16 == 0 and module.out_features % 16 == 0
    return True


def apply_float8(model: nn.Module, device: torch.device, recipe: str = "rowwise") -> list[str]:
    """Swap the eligible nn.Linear layers of `model` for torchao's Float8Linear in place with `recipe`'s
    scaling; returns their names. Call before activation checkpointing, torch.compile and FSDP."""
    check_float8_available(device)
    return convert_to_float8(model, recipe)


def float8_config(recipe: str = "rowwise") -> object:
    """torchao's Float8LinearConfig for `recipe` (rowwise or tensorwise), token counts padded to what the
    float8 matmul takes (see the module docstring)."""
    from torchao.float8 import Float8LinearConfig

    if recipe not in ("rowwise", "tensorwise"):
        raise UserInputError(f"train.fp8_recipe: expected rowwise or tensorwise, got {recipe!r}")
    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True)


def convert_to_float8(model: nn.Module, recipe: str = "rowwise") -> list[str]:
    """`apply_float8` without the device check: the conversion itself."""
    from torchao.float8 import convert_to_float8_training

    names = [
        name for name, m in model.named_modules() if isinstance(m, nn.Linear) and float8_eligible(m, name)
    ]
    convert_to_float8_training(model, config=float8_config(recipe), module_filter_fn=float8_eligible)
    return names
