"""What every family's network is built from and measured by: the forward interface, layers, RoPE, attention
scopes, packing, FLOPs, presets (each family's own network is in its package; the attention kernels it calls
are `vidforge.attention`, its weights' files `vidforge.weights`)."""

from vidforge.models.flops import FlopCount, forward_flops, train_step_flops
from vidforge.models.layers import Conditioning
from vidforge.models.presets import build_model, count_parameters, model_config
from vidforge.tokens import (
    KeyPadding,
    Segments,
    SequenceLayout,
    pack_latents,
    patchify,
    token_grid,
    unpack_tokens,
    unpatchify,
)

__all__ = [
    "Conditioning",
    "FlopCount",
    "KeyPadding",
    "Segments",
    "SequenceLayout",
    "build_model",
    "count_parameters",
    "forward_flops",
    "model_config",
    "pack_latents",
    "patchify",
    "token_grid",
    "train_step_flops",
    "unpack_tokens",
    "unpatchify",
]
