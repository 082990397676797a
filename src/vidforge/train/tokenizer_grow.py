"""A Wan VAE with more compression (NeMo's customised tokenizer), initialised partly from a pretrained one.

Each extra level is one more encoder down-sampling and decoder up-sampling stage (2x spatial), at the
width of the deepest level. (No more temporal compression: AutoencoderKLWan encodes in chunks of 4
frames, and a third halving of time fails inside its causal convolutions.) The encoder's layers are a flat list in
level order, so the pretrained ones keep their names and the new ones come after them; the decoder's
levels run deepest first, so a new level goes in front and the pretrained up_blocks.i become
up_blocks.(i + extra). Tensors are then matched by (renamed) name: loaded, new, reshaped or unused,
reported as `train --init` reports (`InitReport`)."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from vidforge.train.init_weights import InitReport


def grown_config(config: dict[str, Any], spatial: int) -> dict[str, Any]:
    """The Wan VAE config with `spatial` extra levels, none of which halves time."""
    cfg = {k: v for k, v in dict(config).items() if not k.startswith("_")}
    mult = list(cfg.get("dim_mult", [1, 2, 4, 4]))
    down = list(cfg.get("temperal_downsample", [False, True, True]))
    mult += [mult[-1]] * spatial
    down += [False] * spatial
    cfg.update(
        dim_mult=mult,
        temperal_downsample=down,
        scale_factor_spatial=2 ** (len(mult) - 1),
        scale_factor_temporal=2 ** sum(down),
    )
    return cfg


def _renamed(name: str, extra: int) -> str:
    """A pretrained tensor's name in the grown model (decoder levels shift behind the new ones)."""
    return re.sub(r"^decoder\.up_blocks\.(\d+)\.", lambda m: f"decoder.up_blocks.{int(m[1]) + extra}.", name)


@torch.no_grad()
def init_partial(
    model: nn.Module, pretrained: dict[str, torch.Tensor], extra: int, source: str
) -> InitReport:
    """Copy every pretrained tensor that fits (same renamed name and shape) into `model`."""
    stored = {_renamed(k, extra): v for k, v in pretrained.items()}
    own = model.state_dict()
    report = InitReport(source, flag="tokenizer.path")
    for name, tensor in own.items():
        if name not in stored:
            report.new.append(name)
        elif stored[name].shape != tensor.shape:
            report.reshaped.append(name)
        else:
            tensor.copy_(stored[name])
            report.loaded.append(name)
    report.unused = sorted(set(stored) - set(own))
    return report
