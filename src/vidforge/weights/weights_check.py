"""A model config held to its weights' headers before the model is built.

A config.json is data: `num_layers=20000` beside weights for 2 layers had `model import` build 20,000
layers (on the meta device, still minutes) before it could say the two disagree. Here the config builds
one and two layers (meta, instant): what the two differ by is the layer stack (`blocks.1.*`), everything
else is outside it; the stored names' layer indices must then be exactly 0..layers-1, and every stored
shape that of its counterpart in layer 0 or outside the stack. Only then is the whole model worth
building. The shapes come from the safetensors headers (`safetensors_stream.safetensors_shapes`), no
tensor is read."""

from __future__ import annotations

import re
from pathlib import Path

from vidforge.errors import UserInputError
from vidforge.models.presets import build_model
from vidforge.profile.model import Model
from vidforge.weights.safetensors_stream import StoredTensor


def _layer_stack(config: Model) -> tuple[str, dict[str, tuple[int, ...]], list[str], list[str], dict]:
    """The layer stack's prefix (`blocks`), layer 0's tensors (name after `blocks.0.` -> shape), the
    names before and after the stack in the model's order, and their shapes: from a one- and a two-layer
    build on the meta device."""

    def build(layers: int) -> dict[str, tuple[int, ...]]:
        model = build_model(config.model_copy(update={"layers": layers}), device="meta")
        return {n: tuple(t.shape) for n, t in model.state_dict().items()}

    one, two = build(1), list(build(2))
    added = [n for n in two if n not in one]
    prefixes = {m.group(1) for n in added if (m := re.match(r"(.+?)\.1\.", n))}
    if len(prefixes) != 1:
        raise ValueError(f"the {config.family} family's layers are not one numbered stack")  # a family's bug
    (prefix,) = prefixes
    inside = [i for i, n in enumerate(two) if n.startswith((f"{prefix}.0.", f"{prefix}.1."))]
    layer = {n[len(prefix) + 3 :]: s for n, s in one.items() if n.startswith(f"{prefix}.0.")}
    head, tail = two[: inside[0]], two[inside[-1] + 1 :]
    return prefix, layer, head, tail, {n: one[n] for n in head + tail}


def check_config_against_weights(
    config: Model, stored: dict[str, StoredTensor], where: Path, ignored: tuple[str, ...] = ()
) -> list[str]:
    """The model's tensor names in its order, after holding `config` to the `stored` tensors (names
    containing an `ignored` part left out): the layer count, every name and every shape. A disagreement
    is one UserInputError naming the file, before the model is built."""
    prefix, layer, head, tail, outside = _layer_stack(config)
    names = [n for n in stored if not any(part in n for part in ignored)]
    found = re.compile(rf"{re.escape(prefix)}\.(\d+)\.")
    indices = sorted({int(m.group(1)) for n in names if (m := found.match(n))})
    if indices != list(range(config.layers)):
        held = f"{len(indices)} ({prefix}.{indices[0]} .. {prefix}.{indices[-1]})" if indices else "none"
        raise UserInputError(
            f"{where}: the config says {config.layers} layers, the weights hold {held}; the config and the "
            "weights come from different models"
        )
    expected = head + [f"{prefix}.{i}.{rest}" for i in range(config.layers) for rest in layer] + tail
    missing, unexpected = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
    if missing or unexpected:
        raise UserInputError(
            f"{where}: the weights do not match its config (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); the folder is incomplete or holds another model"
        )
    for name in expected:
        m = found.match(name)
        shape = layer[name[m.end() :]] if m else outside[name]
        if stored[name].shape != shape:
            raise UserInputError(
                f"{stored[name].file}: {name} has shape {stored[name].shape}, the config implies {shape}; "
                "the config and the weights come from different models"
            )
    return expected
