"""The vidforge family: this project's DiT and ST-DiT (`vidforge.families.vidforge.dit`; `model.architecture` picks),
trained from scratch or from its own exports (no published layout)."""

from __future__ import annotations

from typing import Any

from vidforge.families import FamilySpec
from vidforge.families.vidforge.model import VidforgeModel

# Shapes of the published models each preset follows. hidden/heads/layers/mlp are the papers' numbers.
# Every preset names its architecture so that `{preset: stdit-7b}` alone builds an ST-DiT. The large
# presets use AdaLN-LoRA (rank 256, as NeMo does): a full modulation projection per block would add
# 9 x hidden^2 per layer (4.2e9 parameters at dit-7b's width). Parameter counts of vidforge's blocks
# (`vidforge.models.count_parameters`): dit-1b 1.5e9, dit-7b 8.0e9, dit-14b 14.9e9, dit-28b 30.3e9,
# stdit-7b 7.3e9, stdit-12b 12.9e9.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "architecture": "dit",
        "layers": 2,
        "hidden": 64,
        "heads": 4,
        "mlp_hidden": 256,
        "text_dim": 32,
        "in_channels": 4,
    },
    "small": {
        "architecture": "dit",
        "layers": 6,
        "hidden": 256,
        "heads": 8,
        "mlp_hidden": 1024,
        "text_dim": 256,
        "in_channels": 4,
    },
    # Wan2.1-1.3B: 30 x 1536, 12 heads of 128, MLP 8960, umT5 text (4096), 16 latent channels.
    "dit-1b": {
        "architecture": "dit",
        "layers": 30,
        "hidden": 1536,
        "heads": 12,
        "mlp_hidden": 8960,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    # NeMo video foundation model paper, DiT-7B / 28B; dit-14b is the 14B infrastructure article's DiT
    # ("Training 14B Video Models: Infrastructure Deep Dive": 40 layers, 5120 wide, 40 heads, FFN 13,824),
    # which is Wan2.1-14B's shape.
    "dit-7b": {
        "architecture": "dit",
        "layers": 28,
        "hidden": 4096,
        "heads": 32,
        "mlp_hidden": 16384,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    "dit-14b": {
        "architecture": "dit",
        "layers": 40,
        "hidden": 5120,
        "heads": 40,
        "mlp_hidden": 13824,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    "dit-28b": {
        "architecture": "dit",
        "layers": 48,
        "hidden": 6144,
        "heads": 48,
        "mlp_hidden": 24576,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    # The NeMo paper's ST-DiT 7B and 12B sizes. An ST-DiT block holds two self-attentions (spatial,
    # temporal), so at equal width it has ~1.3x the parameters of a DiT block. The paper gives the
    # sizes, not every dimension: these widths and depths are ours, chosen to land on those sizes.
    "stdit-7b": {
        "architecture": "stdit",
        "layers": 36,
        "hidden": 3072,
        "heads": 24,
        "mlp_hidden": 12288,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
    "stdit-12b": {
        "architecture": "stdit",
        "layers": 36,
        "hidden": 4096,
        "heads": 32,
        "mlp_hidden": 16384,
        "in_channels": 16,
        "text_dim": 4096,
        "adaln_lora_rank": 256,
    },
}


def block_scopes(cfg: Any) -> tuple[tuple[str, ...], int]:
    """A DiT block: full attention, 9 modulation chunks; an ST-DiT block by its `stdit_block`."""
    if cfg.architecture == "dit":
        return ("full",), 9
    if cfg.stdit_block == "parallel":
        return ("spatial", "temporal", "full"), 9
    if cfg.stdit_block == "parallel-mm":
        return ("spatial", "temporal", "full"), 10
    return ("spatial", "temporal"), 12


def layout_rules(profile: Any, layout: Any) -> list[str]:
    """The multimodal parallel block (stdit_block=parallel-mm) has no tensor- or context-parallel plan
    yet: its joint attention appends each sample's text keys to every group's video keys."""
    if not profile.model.multimodal_block:
        return []
    return [
        f"parallel.{name}: model.stdit_block=parallel-mm has no {what} plan yet ({name}={degree}); "
        f"set parallel.{name}=1 or model.stdit_block=parallel"
        for name, what, degree in (
            ("tp", "tensor-parallel", layout.tp),
            ("cp", "context-parallel", layout.cp),
        )
        if degree > 1
    ]


SPEC = FamilySpec(
    name="vidforge",
    model=VidforgeModel,
    network="vidforge.families.vidforge.dit:DiT",
    presets=PRESETS,
    # What `vidforge.parallel.tensor_parallel.apply_tp` splits: in a block every Linear (q/k/v, fc1/fc3
    # and the modulation column-wise, out/fc2 row-wise) except the row-wise layers' biases, the per-head
    # QK norms and AdaLN-LoRA's rank-r down projection, which stay replicated; outside the blocks the
    # shared modulation and the final layer's modulation (column-wise); the embeddings and the final
    # projection stay replicated.
    tensor_parallel="vidforge.families.vidforge.tensor_parallel:apply_tp",
    tp_rules=(
        ("q_norm", "k_norm", "modulation.down"),
        ("out", "fc2"),
        ("shared_modulation.", "final.modulation."),
        ("modulation.proj", "modulation.up"),  # the block's modulation: gathered again
    ),
    # The attention projections (the LoRA paper's choice).
    lora_targets=("q", "k", "v", "out"),
    block_scopes=block_scopes,
    layout_rules=layout_rules,
)
