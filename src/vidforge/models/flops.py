"""Analytic FLOPs of a forward pass and a training step, for any model section and sequence layout.

Counts matrix multiplies only (2*m*n*k each), as MFU conventionally does and as
`torch.utils.flop_counter.FlopCounterMode` does: every Linear, and attention's two products (QK^T and
PV). Attention counts the useful work only: per sample S_i^2 for full attention, per frame and per
position for spatial and temporal attention, S_i x L_i for cross-attention (and S_i x I_i to an
image-to-video model's image tokens, beside the caption's); a dense block-diagonal mask
over a packed row costs more than this. Under sliding-tile attention (`model.attention_window`) a layer's
full attention counts the (query, key) pairs its windows attend (`sliding_tile.attended_pairs`), under
video sparse attention (`model.attention_topk`) the pairs of its selected tiles and coarse pass
(`video_sparse.selected_pairs`), and `FlopCount.skipped_attention` the forward FLOPs full attention
would have spent beyond them.

A per-token noise level (a first-frame conditioned model's, `model.expand_timesteps`: the condition
frame's tokens at level 0) runs the timestep MLP and the modulation projection once per token instead of
once per sample. An image-to-video model (`model.image_dim`) embeds its image tokens (a LayerNorm and a
two-layer feed-forward, image_dim -> image_dim -> hidden) and each block's cross-attention projects their
keys and values (add_k_proj, add_v_proj); `model.condition_channels` widens the patch embedding's input.

Backward costs twice the forward for each matmul (the input gradient and the weight gradient), except
where the input needs no gradient (the patch embedding of data, the first layers of the timestep and
text MLPs), which cost once. Full activation recompute repeats the blocks' forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vidforge.families import family
from vidforge.models.sliding_tile import attended_pairs
from vidforge.models.video_sparse import selected_pairs
from vidforge.profile.model import Model
from vidforge.tokens import Grid, SequenceLayout

TIMESTEP_FREQUENCIES = 256  # sinusoidal features of TimestepEmbedding


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs by part, and what the backward and recompute rules need."""

    parts: dict[str, int] = field(default_factory=dict)
    """Forward FLOPs: `embed` (patch, timestep, text, shared modulation), `modulation`, `projections`
    (q/k/v/out of every attention), `attention` (QK^T and PV), `mlp`, `final`."""
    no_grad_input: int = 0
    """Forward FLOPs of matmuls whose input needs no gradient: their backward costs 1x, not 2x."""
    blocks: int = 0
    """Forward FLOPs inside the transformer blocks (what full activation recompute runs again)."""
    skipped_attention: int = 0
    """Forward FLOPs of QK^T and PV that sliding-tile or video sparse attention skips (not in `parts`):
    full attention's minus theirs. 0 without `model.attention_window` or `model.attention_topk`."""

    @property
    def forward(self) -> int:
        return sum(self.parts.values())

    def train_step(self, recompute_fraction: float = 0.0) -> int:
        """Forward + backward, + the forward of that fraction of the blocks again (activation recompute:
        1.0 under full checkpointing). With 0 these are the model FLOPs (MFU's numerator); with the run's
        recompute, the hardware FLOPs (HFU's)."""
        if not 0.0 <= recompute_fraction <= 1.0:
            raise ValueError(
                f"recompute_fraction: a fraction of the blocks in [0, 1], got {recompute_fraction}"
            )
        backward = 2 * self.forward - self.no_grad_input
        return self.forward + backward + round(self.blocks * recompute_fraction)


def _grids(layout: SequenceLayout | Sequence[Grid]) -> list[Grid]:
    grids = list(layout.grids) if isinstance(layout, SequenceLayout) else [tuple(g) for g in layout]
    if not grids or any(len(g) != 3 or min(g) < 1 for g in grids):
        raise ValueError(f"layout: give a SequenceLayout or token grids (t, h, w) per sample, got {grids}")
    return grids


def _per_sample(values: int | Sequence[int], n: int, name: str) -> list[int]:
    out = [int(values)] * n if isinstance(values, int) else [int(x) for x in values]
    if len(out) != n:
        raise ValueError(f"{name}: one per sample ({n}), got {len(out)}")
    return out


def image_tokens(cfg: Model) -> int:
    """Image-embedding tokens a clip of the model `cfg` reads: its family's image encoder's
    (`FamilySpec.image_tokens`) with `model.image_dim`, else none."""
    return family(cfg.family).image_tokens if cfg.image_dim else 0


def forward_flops(
    cfg: Model,
    layout: SequenceLayout | Sequence[Grid],
    text_lens: int | Sequence[int],
    image_lens: int | Sequence[int] | None = None,
    token_levels: bool = False,
) -> FlopCount:
    """FLOPs of one forward of the model `cfg` over the samples whose token grids `layout` gives (a
    plain batch of B clips is B equal grids). `text_lens`: caption tokens each sample's text projection
    and cross-attention process (a plain batch processes the padded length; a packed row the real
    lengths), one number for all or one per sample. The wan family attends to every caption position,
    padding included, so its `text_lens` is the padded caption length (512 for Wan2.1) in both cases.
    `image_lens`: image-embedding tokens each sample's cross-attention also reads (a model with
    `model.image_dim`; default `image_tokens(cfg)`). `token_levels`: the noise level is per token
    (`model.expand_timesteps` conditioning on a first frame), not per sample."""
    grids = _grids(layout)
    n = len(grids)
    lens = _per_sample(text_lens, n, "text_lens")
    images = _per_sample(image_tokens(cfg) if image_lens is None else image_lens, n, "image_lens")
    if any(images) and not cfg.image_dim:
        raise ValueError(
            f"image_lens: this model has no image embedding (image_dim 0) to read image tokens with; got {images}"
        )
    d, m, p, r = cfg.hidden, cfg.mlp_hidden, cfg.patch_dim, cfg.adaln_lora_rank
    seqlens = [t * h * w for t, h, w in grids]
    s, text, image = sum(seqlens), sum(lens), sum(images)
    times = s if token_levels else n  # rows of the timestep MLP and the modulation projections

    # Which attention scopes each block runs, and its modulation chunks (the family's block says). A
    # table-modulated block (Wan) projects the timestep into its modulation vectors once (time_proj) and
    # adds a learned table per block: no per-block or final-layer modulation matmul.
    spec = family(cfg.family)
    scopes, chunks = spec.block_scopes(cfg)
    table = spec.table_modulation

    def core(scope: str, window: tuple[int, int, int] | None = None, dense: bool = False) -> int:
        """QK^T and PV of one self-attention: 2 products x 2*d FLOPs per (query, key) pair (`dense`: full
        attention's, whatever the profile's sparsity)."""
        if scope == "full" and cfg.attention_topk is not None and not dense:
            pairs = sum(selected_pairs(g, cfg.attention_tile, cfg.attention_topk) for g in grids)
        elif scope == "full":
            pairs = sum(attended_pairs(g, cfg.attention_tile, window) for g in grids)
        elif scope == "spatial":
            pairs = sum(t * (h * w) ** 2 for t, h, w in grids)
        else:
            pairs = sum(h * w * t * t for t, h, w in grids)
        return 4 * d * pairs

    patch = 2 * s * (p // cfg.in_channels) * (cfg.in_channels + cfg.condition_channels) * d
    time_fc1, time_fc2 = 2 * times * TIMESTEP_FREQUENCIES * d, 2 * times * d * d
    text_fc1, text_fc2 = 2 * text * cfg.text_dim * d, 2 * text * d * d
    image_ff = 2 * image * cfg.image_dim * (cfg.image_dim + d)  # image_dim -> image_dim -> hidden
    shared = 2 * times * d * chunks * d if r or table else 0
    embed = patch + time_fc1 + time_fc2 + text_fc1 + text_fc2 + image_ff + shared

    if table:
        modulation = 0
    elif r:
        modulation = 2 * times * d * r + 2 * times * r * chunks * d
    else:
        modulation = 2 * times * d * chunks * d
    self_proj = 4 * 2 * s * d * d * len(scopes)
    if cfg.multimodal_block:
        # No cross-attention: every branch's video queries also attend to the caption and the context
        # latents, whose keys and values each branch projects with its own text k/v.
        keys = [x + cfg.context_latents for x in lens]
        cross_proj = len(scopes) * 2 * (2 * sum(keys) * d * d)
        text_pairs = len(scopes) * sum(si * ki for si, ki in zip(seqlens, keys, strict=True))
    else:
        # q and out from the video tokens, k and v from the caption's and (I2V) from the image's
        cross_proj = 2 * (2 * s * d * d) + 2 * (2 * (text + image) * d * d)
        text_pairs = sum(si * (li + ii) for si, li, ii in zip(seqlens, lens, images, strict=True))
    windows = [cfg.layer_window(i) for i in range(cfg.layers)]
    attn = [sum(core(sc, w if sc == "full" else None) for sc in scopes) + 4 * d * text_pairs for w in windows]
    sparse = [w for w in windows if w is not None or cfg.attention_topk is not None]
    skipped = sum(core("full", dense=True) - core("full", w) for w in sparse if "full" in scopes)
    mlp = (3 if cfg.mlp_act == "swiglu" else 2) * 2 * s * d * m
    final = (0 if table else 2 * times * d * 2 * d) + 2 * s * d * p

    layers = cfg.layers
    parts = {
        "embed": embed,
        "modulation": layers * modulation,
        "projections": layers * (self_proj + cross_proj),
        "attention": sum(attn),
        "mlp": layers * mlp,
        "final": final,
    }
    blocks = parts["modulation"] + parts["projections"] + parts["attention"] + parts["mlp"]
    return FlopCount(
        parts=parts, no_grad_input=patch + time_fc1 + text_fc1, blocks=blocks, skipped_attention=skipped
    )


def train_step_flops(
    cfg: Model,
    layout: SequenceLayout | Sequence[Grid],
    text_lens: int | Sequence[int],
    recompute_fraction: float = 0.0,
) -> int:
    """FLOPs of forward + backward (about 3x forward; about 4x with full activation recompute)."""
    return forward_flops(cfg, layout, text_lens).train_step(recompute_fraction)
