"""FLOPs of a forward pass and a training step, for any model section and sequence layout, read off the
family's network: each sample's token grid, caption and image tokens run through a one-block copy of the
network on the meta device (no memory, no compute: a 14B model at 75K tokens takes a fraction of a
second) under torch's `FlopCounterMode`, forward and backward, attributed per module: the block's, its
`Attend` modules' (QK^T and PV), the rest (outside the blocks). The model's count is the outside once
plus `layers` x the block; a packed row costs the sum of its samples (attention stays inside each).
Counts are cached per (model section, grid, caption tokens, image tokens, noise level per token).

Counts matrix multiplies only (2*m*n*k each), as MFU conventionally does: attention runs on the `dense`
backend, whose explicit matmuls count the useful work of a fused kernel (QK^T and PV: 2 x 2 x d per
(query, key) pair, the backward twice that). Under sliding-tile attention (`model.attention_window`) a
layer's full attention counts the (query, key) pairs its windows attend (`sliding_tile.attended_pairs`),
under video sparse attention (`model.attention_topk`) the pairs of its selected tiles and coarse pass
(`video_sparse.selected_pairs`), and `FlopCount.skipped_attention` the forward FLOPs full attention would
have spent beyond them. Full activation recompute repeats the blocks' forward.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from vidforge.attention.dispatch import Attend
from vidforge.attention.sliding_tile import attended_pairs
from vidforge.attention.video_sparse import selected_pairs
from vidforge.families import family
from vidforge.models.presets import build_model
from vidforge.profile.model import Model
from vidforge.tokens import Grid, SequenceLayout

TIMESTEP_FREQUENCIES = 256  # sinusoidal features of TimestepEmbedding


@dataclass(frozen=True)
class FlopCount:
    """Forward FLOPs by part, and what the backward and recompute rules need."""

    parts: dict[str, int] = field(default_factory=dict)
    """Forward FLOPs: `outside` (the embeddings, timestep and caption MLPs, final layer), `blocks` (the
    blocks' matmuls but attention's), `attention` (QK^T and PV of every block)."""
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


SPARSE_FIELDS = ("attention_window", "attention_topk")
"""Per-layer or data-dependent attention sparsity: counted from attended pairs, not by the module."""


@dataclass(frozen=True)
class BlockFlops:
    """FLOPs of one sample's forward and backward, read off the module."""

    block: int
    """Forward FLOPs of one block."""
    block_attention: int
    """Of those, its attention kernels' (QK^T and PV, self and cross)."""
    block_backward: int
    outside: int
    """Forward FLOPs outside the blocks (embeddings, timestep and caption MLPs, final layer)."""
    outside_backward: int


_ONE_BLOCK: dict[str, Model] = {}
"""`meta_key` -> the model section it names (the caches below key on the text, sections are unhashable)."""


def meta_key(cfg: Model, **update: object) -> str:
    """The model section with one block, the attention backend `update` names and no per-layer
    sparsity (`SPARSE_FIELDS`), as a cache key; `one_block(key)` gives the section back."""
    one = cfg.model_copy(update={"layers": 1, **{f: None for f in SPARSE_FIELDS}, **update})
    key = json.dumps(one.model_dump(mode="json"), sort_keys=True)
    _ONE_BLOCK.setdefault(key, one)
    return key


def one_block(key: str) -> Model:
    return _ONE_BLOCK[key]


@functools.lru_cache(maxsize=8)
def meta_network(key: str, dtype: torch.dtype) -> torch.nn.Module:
    """The network of the one-block section `key` on the meta device, in `dtype`."""
    return build_model(one_block(key), device="meta").to(dtype)


def first_block(model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    blocks = model.blocks  # every family's network names its stack `blocks`
    name, block = next(iter(blocks.items())) if isinstance(blocks, torch.nn.ModuleDict) else ("0", blocks[0])
    prefix = next(n for n, m in model.named_modules() if m is block)
    return prefix, block


def meta_inputs(
    cfg: Model,
    grids: Sequence[Grid],
    packed: bool,
    text: int,
    image: int,
    token_levels: bool,
    dtype: torch.dtype,
) -> tuple[tuple[torch.Tensor, ...], dict[str, object]]:
    """The forward arguments of one row on the meta device (the shapes `VideoTransformer.forward` takes):
    one clip of token grid `grids[0]`, or with `packed` the clips of `grids` packed into one row of patch
    tokens with its `SequenceLayout`; each clip with `text` caption and `image` image tokens."""
    meta = {"device": "meta", "dtype": dtype}
    samples, tokens = len(grids), sum(t * h * w for t, h, w in grids)
    levels = (1, tokens) if token_levels else (samples,)
    keywords: dict[str, object] = {}
    if packed:
        features = cfg.patch[0] * cfg.patch[1] * cfg.patch[2]
        x = torch.empty(1, tokens, cfg.in_channels * features, **meta)
        condition = (1, tokens, cfg.condition_channels * features)
        keywords["layout"] = SequenceLayout(tuple(tuple(g) for g in grids))
    else:
        if samples != 1:
            raise ValueError(f"meta_inputs: one clip a row unless packed, got {samples} grids")
        latent = [g * p for g, p in zip(grids[0], cfg.patch, strict=True)]
        x = torch.empty(1, cfg.in_channels, *latent, **meta)
        condition = (1, cfg.condition_channels, *latent)
    args = (x, torch.empty(levels, device="meta"), torch.empty(samples, text, cfg.text_dim, **meta))
    if cfg.condition_channels:
        keywords["condition"] = torch.empty(condition, **meta)
    if cfg.image_dim:
        keywords["image"] = torch.empty(samples, image, cfg.image_dim, **meta)
    return args, keywords


def _total(counts: dict[str, dict[object, int]], name: str) -> int:
    return sum(counts.get(name, {}).values())


def sample_flops(cfg: Model, grid: Grid, text: int, image: int, token_levels: bool) -> BlockFlops:
    """FLOPs of one sample (token grid `grid`, `text` caption and `image` image tokens) through the
    model `cfg`, its blocks' and the rest's, counted by FlopCounterMode on the meta device."""
    key = meta_key(cfg, attention="dense")
    # autograd whatever the caller's mode (a training step's no_grad, infer's inference_mode): the network,
    # its inputs and both passes are built here
    with torch.inference_mode(False), torch.enable_grad():
        return _sample_flops(key, tuple(grid), text, image, token_levels)


@functools.lru_cache(maxsize=4096)
def _sample_flops(key: str, grid: Grid, text: int, image: int, token_levels: bool) -> BlockFlops:
    model = meta_network(key, torch.float32)
    cfg = one_block(key)
    top = type(model).__name__
    prefix, block = first_block(model)
    attends = [f"{top}.{prefix}.{n}" for n, m in block.named_modules() if isinstance(m, Attend)]
    args, keywords = meta_inputs(cfg, (grid,), False, text, image, token_levels, torch.float32)
    # one counter over both passes: it attributes the backward to modules by the hooks the forward sets
    with FlopCounterMode(display=False) as counter:
        out = model(*args, **keywords)
        fwd = {k: dict(v) for k, v in counter.get_flop_counts().items()}
        out.float().square().mean().backward()
        both = counter.get_flop_counts()
    bwd = {k: {op: n - fwd.get(k, {}).get(op, 0) for op, n in v.items()} for k, v in both.items()}
    name = f"{top}.{prefix}"
    return BlockFlops(
        block=_total(fwd, name),
        block_attention=sum(_total(fwd, a) for a in attends),
        block_backward=_total(bwd, name),
        outside=_total(fwd, "Global") - _total(fwd, name),
        outside_backward=_total(bwd, "Global") - _total(bwd, name),
    )


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
    and attention to the caption process (a plain batch processes the padded length; a packed row the
    real lengths), one number for all or one per sample. The wan family attends to every caption
    position, padding included, so its `text_lens` is the padded caption length (512 for Wan2.1) in both
    cases. `image_lens`: image-embedding tokens each sample reads (a model with `model.image_dim`;
    default `image_tokens(cfg)`). `token_levels`: the noise level is per token (`model.expand_timesteps`
    conditioning on a first frame), not per sample.

    Each sample is run alone through the family's network (`sample_flops`; a packed row costs the sum of
    its samples, attention staying inside each), and sliding-tile or video sparse attention subtracts
    the pairs its layers skip from the dense count."""
    grids = _grids(layout)
    n = len(grids)
    lens = _per_sample(text_lens, n, "text_lens")
    images = _per_sample(image_tokens(cfg) if image_lens is None else image_lens, n, "image_lens")
    if any(images) and not cfg.image_dim:
        raise ValueError(
            f"image_lens: this model has no image embedding (image_dim 0) to read image tokens with; got {images}"
        )
    counts = [
        sample_flops(cfg, tuple(g), t, i, token_levels) for g, t, i in zip(grids, lens, images, strict=True)
    ]
    layers = cfg.layers
    attention = layers * sum(c.block_attention for c in counts)
    skipped = _skipped_attention(cfg, grids)
    parts = {
        "outside": sum(c.outside for c in counts),
        "blocks": layers * sum(c.block - c.block_attention for c in counts),
        "attention": attention - skipped,
    }
    forward = sum(parts.values())
    backward = sum(c.outside_backward + layers * c.block_backward for c in counts) - 2 * skipped
    return FlopCount(
        parts=parts,
        no_grad_input=2 * forward - backward,
        blocks=parts["blocks"] + parts["attention"],
        skipped_attention=skipped,
    )


def _skipped_attention(cfg: Model, grids: list[Grid]) -> int:
    """Forward FLOPs of QK^T and PV that the layers' sliding-tile windows or video sparse selection skip
    in the block's full-attention scopes: (dense pairs - attended pairs) x 2 products x 2 x hidden."""
    windows = [cfg.layer_window(i) for i in range(cfg.layers)]
    sparse = [w for w in windows if w is not None or cfg.attention_topk is not None]
    scopes, _ = family(cfg.family).block_scopes(cfg)
    if not sparse or "full" not in scopes:
        return 0
    dense = sum((t * h * w) ** 2 for t, h, w in grids)
    skipped = 0
    for window in sparse:
        if cfg.attention_topk is not None:
            pairs = sum(selected_pairs(g, cfg.attention_tile, cfg.attention_topk) for g in grids)
        else:
            pairs = sum(attended_pairs(g, cfg.attention_tile, window) for g in grids)
        skipped += scopes.count("full") * 4 * cfg.hidden * (dense - pairs)
    return skipped


def train_step_flops(
    cfg: Model,
    layout: SequenceLayout | Sequence[Grid],
    text_lens: int | Sequence[int],
    recompute_fraction: float = 0.0,
) -> int:
    """FLOPs of forward + backward (about 3x forward; about 4x with full activation recompute)."""
    return forward_flops(cfg, layout, text_lens).train_step(recompute_fraction)
