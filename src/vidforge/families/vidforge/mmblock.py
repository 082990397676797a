"""Vchitect-2.0's multimodal parallel block (`model.stdit_block: parallel-mm`), after SD3's MM-DiT.

Each block has three attention branches that read the same adaLN-modulated video tokens and are summed,
each under its own gate, then an MLP:

    h = mod(norm(x));  c = mod_text(norm([caption; context latents]))
    x += g_spatial * A_spatial(h, c) + g_temporal * A_temporal(h, c) + g_full * A_full(h, c)
    x += g_mlp * MLP(mod(norm(x)))

Every branch is a joint (MM-DiT) attention: the video tokens of one group (a frame for spatial, one
(h, w) position's frames for temporal, the whole clip for full) attend to themselves and to their own
sample's text tokens, with per-modality weights: video q/k/v/out and QK-norms, and separate text k/v and
k-norm (SD3's add_k_proj / add_v_proj / norm_added_k). Putting the caption beside every frame's tokens is
the paper's text interleaved with the frames it describes: the spatial branch's key row is
[frame 0, text, frame 1, text, ...] under a block-diagonal mask. Text keys get no RoPE (SD3; Flux
gives text position 0, the same); the spatial branch rotates video by (h, w) only, so its text attention
does not depend on the frame's index (see `spatial_rope`).

Where the paper is silent, chosen here:
- The text side is not a residual stream carried from block to block: every block reads the projected
  caption from `Conditioning` (as cross-attention does), like SD3's last block (`context_pre_only`).
  So the block keeps the one-stream interface pipeline parallel and checkpointing rely on, and has no
  text queries, text output projection or text MLP (their outputs would go nowhere).
- Learnable context latents: `model.context_latents` tokens per block, appended to every sample's
  caption before the text norm, so they pass the text-side weights and are keys of every branch (a
  sample with an empty or null caption still has keys to attend to besides its own video).
- The image model this block extends is the same block with the spatial branch only
  (`MMParallelBlock(cfg, video=False)`): per-frame joint attention and the MLP, what SD3 is for one
  image. The temporal and full (cross-frame) branches are the new ones; their gates are separate
  modulation outputs, placed last, that `video_state_from_image` sets to zero when it builds a video
  block's weights from an image block's, so at step 0 the video block equals the image model frame by
  frame. Only the gates start at zero, not the branch out projections as well: with both at zero neither
  would receive a gradient.
- No cross-attention sub-layer: the caption enters through the joint attention of every branch.

Packed rows are supported (the key row is built by one index gather, text interleaved per group).
Context and tensor parallel are refused by the layout rulebook: this block has no plan for them yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.dispatch import AttentionMask
from vidforge.errors import UserInputError
from vidforge.families.vidforge.blocks import _attend, _norm
from vidforge.models.layers import MLP, Conditioning, Modulation, SelfAttention, modulate
from vidforge.models.rope import axis_dims
from vidforge.models.scopes import Scope
from vidforge.profile.model import Model
from vidforge.tokens import KeyPadding, Segments

IMAGE_CHUNKS = 8  # video shift/scale, spatial gate, mlp shift/scale/gate, text shift/scale
VIDEO_GATES = 2  # temporal gate, full gate: the last chunks, zero when starting from an image model
GATES = {"spatial": 2, "temporal": 8, "full": 9}  # each branch's gate among the modulation chunks


@dataclass(frozen=True)
class TextSide:
    """The text tokens every branch attends to: `tokens` (B, L + latents, hidden) with `mask` (B, L +
    latents) bool or None for a plain batch; (1, sum of L_i + latents, hidden) with `lens` when packed."""

    tokens: torch.Tensor
    mask: torch.Tensor | None
    lens: tuple[int, ...] | None


def text_side(cond: Conditioning, latents: torch.Tensor) -> TextSide:
    """Each sample's real caption tokens followed by the context latents (n, hidden)."""
    text, n = cond.text, latents.shape[0]
    if isinstance(cond.text_mask, Segments):
        lens = cond.text_mask.kv_lens
        parts = []
        for caption in text[0].split(list(lens)):
            parts += [caption, latents.to(text.dtype)]
        return TextSide(torch.cat(parts).unsqueeze(0), None, tuple(x + n for x in lens))
    tokens = torch.cat([text, latents.to(text.dtype).expand(text.shape[0], -1, -1)], dim=1)
    if isinstance(cond.text_mask, KeyPadding):
        ones = torch.ones(text.shape[0], n, dtype=torch.bool, device=text.device)
        return TextSide(tokens, torch.cat([cond.text_mask.mask, ones], dim=1), None)
    return TextSide(tokens, None, None)


@dataclass(frozen=True)
class JointKeys:
    """How a scope's video keys (after `scope.gather`) and the text keys form one key row per group.
    Plain batch: text repeated per group and appended (`mask` a KeyPadding or None). Packed: `index`
    picks from [video keys; text keys] the group's video tokens then its sample's text tokens."""

    mask: AttentionMask
    index: torch.Tensor | None

    def __call__(self, video: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        if self.index is not None:
            return torch.cat([video, text], dim=1)[:, self.index]
        groups = video.shape[0] // text.shape[0]
        return torch.cat([video, text.repeat_interleave(groups, dim=0)], dim=1)


# Per Conditioning (one per forward, holding both the scopes and the caption mask the keys depend on), so
# the blocks of a forward share one index and mask per scope.
_JOINT: WeakKeyDictionary[Conditioning, dict[str, JointKeys]] = WeakKeyDictionary()


def joint_keys(scope: Scope, side: TextSide, cond: Conditioning, device: torch.device) -> JointKeys:
    """The scope's JointKeys for this forward's conditioning, built by its first block."""
    built = _JOINT.setdefault(cond, {})
    if scope.name not in built:
        built[scope.name] = _joint_keys(scope, side, cond, device)
    return built[scope.name]


def _joint_keys(scope: Scope, side: TextSide, cond: Conditioning, device: torch.device) -> JointKeys:
    if isinstance(scope.mask, Segments):
        return _packed_keys(scope.mask, side.lens, cond.text_mask.q_lens, device)
    if scope.mask is not None:
        raise UserInputError(
            f"model.stdit_block=parallel-mm: {scope.name} attention over a {type(scope.mask).__name__} has no "
            "joint text keys (context parallel); set parallel.cp=1 or use stdit_block=parallel"
        )
    if side.mask is None:
        return JointKeys(None, None)
    groups = _groups_per_sample(scope)
    video = torch.ones(side.mask.shape[0] * groups, _group_len(scope), dtype=torch.bool, device=device)
    return JointKeys(KeyPadding(torch.cat([video, side.mask.repeat_interleave(groups, 0)], 1)), None)


def _groups_per_sample(scope: Scope) -> int:
    t, h, w = scope.grid
    return {"full": 1, "spatial": t, "temporal": h * w}[scope.name]


def _group_len(scope: Scope) -> int:
    t, h, w = scope.grid
    return {"full": t * h * w, "spatial": h * w, "temporal": t}[scope.name]


def _packed_keys(
    groups: Segments, text_lens: tuple[int, ...], sample_tokens: tuple[int, ...], device: torch.device
) -> JointKeys:
    """Groups come sample by sample in every scope (frames, positions or the whole sample), so a group's
    sample is found by counting its tokens against each sample's token count: host integers only."""
    video_total = groups.total_q
    text_starts = [video_total + sum(text_lens[:i]) for i in range(len(text_lens))]
    index, kv_lens = [], []
    sample, used, start = 0, 0, 0
    for length in groups.q_lens:
        while used == sample_tokens[sample]:
            sample, used = sample + 1, 0
        index.append(torch.arange(start, start + length))
        index.append(torch.arange(text_starts[sample], text_starts[sample] + text_lens[sample]))
        kv_lens.append(length + text_lens[sample])
        start, used = start + length, used + length
    return JointKeys(Segments(groups.q_lens, kv_lens), torch.cat(index).to(device))


def spatial_rope(rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables with the t channels' rotation removed. Within a frame t is constant, so video-video
    scores do not change; but text keys carry no rotation, so a query rotated by its frame's t would
    meet the caption differently in each frame. Without it the spatial branch is the image model's
    attention on every frame."""
    cos, sin = rope
    t_pairs = axis_dims(2 * cos.shape[-1])[0] // 2
    return F.pad(cos[..., t_pairs:], (t_pairs, 0), value=1.0), F.pad(sin[..., t_pairs:], (t_pairs, 0))


class JointAttention(SelfAttention):
    """Video queries attend to the group's video keys and the sample's text keys. The video weights keep
    SelfAttention's names (q, k, v, out, q_norm, k_norm); the text side has its own k, v and k-norm."""

    def __init__(self, cfg: Model) -> None:
        super().__init__(cfg.hidden, cfg.heads, cfg.qk_norm, _attend(cfg))
        self.text_k = nn.Linear(cfg.hidden, cfg.hidden)
        self.text_v = nn.Linear(cfg.hidden, cfg.hidden)
        self.text_k_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if cfg.qk_norm else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        scope: Scope,
        text: torch.Tensor,
        keys: JointKeys,
    ) -> torch.Tensor:
        q, k, v = self.project(x, rope)
        text_k = self.text_k_norm(self.text_k(text).unflatten(-1, (-1, self.head_dim)))
        text_v = self.text_v(text).unflatten(-1, (-1, self.head_dim))
        kv_k, kv_v = keys(scope.gather(k), text_k), keys(scope.gather(v), text_v)
        out = self.attend(scope.gather(q), kv_k, kv_v, keys.mask)
        return self.out(scope.scatter(out).flatten(-2))


class MMParallelBlock(nn.Module):
    """See the module docstring. `video=False` builds the image model: the spatial branch and the MLP."""

    chunks = IMAGE_CHUNKS + VIDEO_GATES

    def __init__(self, cfg: Model, video: bool = True) -> None:
        super().__init__()
        self.branches = ("spatial", "temporal", "full") if video else ("spatial",)
        self.chunks = IMAGE_CHUNKS + (VIDEO_GATES if video else 0)
        self.modulation = Modulation(cfg.hidden, self.chunks, cfg.adaln_lora_rank)
        self.norm1, self.norm2, self.text_norm = _norm(cfg.hidden), _norm(cfg.hidden), _norm(cfg.hidden)
        self.context_latents = nn.Parameter(torch.empty(cfg.context_latents, cfg.hidden))
        self.reset_context_latents()
        self.spatial_attn = JointAttention(cfg)
        if video:
            self.temporal_attn, self.full_attn = JointAttention(cfg), JointAttention(cfg)
        self.mlp = MLP(cfg.hidden, cfg.mlp_hidden, cfg.mlp_act)

    def reset_context_latents(self) -> None:
        """N(0, 0.02), like the learned null caption (called again by `DiT.init_weights`)."""
        nn.init.normal_(self.context_latents, std=0.02)

    def branch_outputs(self, x: torch.Tensor, cond: Conditioning) -> tuple[dict[str, torch.Tensor], tuple]:
        """Each branch's ungated output, and the modulation chunks (exposed so tests can read the
        branches one by one)."""
        params = self.modulation.params(cond)
        chunks = cond.per_token(params).chunk(self.chunks, dim=-1)
        side = text_side(cond, self.context_latents)
        shift_t, scale_t = params.chunk(self.chunks, dim=-1)[6:8]
        if side.lens is None:
            shift_t, scale_t = shift_t[:, None], scale_t[:, None]
        else:
            sample = torch.repeat_interleave(
                torch.arange(len(side.lens), device=x.device), torch.tensor(side.lens, device=x.device)
            )
            shift_t, scale_t = shift_t[sample][None], scale_t[sample][None]
        text = modulate(self.text_norm(side.tokens), shift_t, scale_t)
        h = modulate(self.norm1(x), chunks[0], chunks[1])
        outs = {}
        for name in self.branches:
            scope = cond.scopes[name]
            keys = joint_keys(scope, side, cond, x.device)
            rope = spatial_rope(cond.rope) if name == "spatial" else cond.rope
            outs[name] = getattr(self, f"{name}_attn")(h, rope, scope, text, keys)
        return outs, chunks

    def forward(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        outs, chunks = self.branch_outputs(x, cond)
        for name, out in outs.items():
            x = x + chunks[GATES[name]] * out
        return x + chunks[5] * self.mlp(modulate(self.norm2(x), chunks[3], chunks[4]))


def video_state_from_image(image: dict[str, torch.Tensor], video: nn.Module) -> dict[str, torch.Tensor]:
    """A video model's state dict started from an image model's (blocks built with `video=False`): the
    image weights where names and shapes match; the new branches' attention keeps the video model's own
    initialisation; the modulation outputs the image model lacks (the temporal and full gates, last) are
    zero, so the video model's output equals the image model's until training moves them."""
    state = {name: value.clone() for name, value in video.state_dict().items()}
    for name, value in image.items():
        if name not in state:
            raise UserInputError(
                f"image weights: {name} has no place in the video model; check model.stdit_block"
            )
        target = state[name]
        if target.shape == value.shape:
            target.copy_(value)
        elif target.shape[1:] == value.shape[1:] and target.shape[0] > value.shape[0]:
            # A modulation output (per block, or AdaLN-LoRA's shared one): image chunks first, gates after.
            target[: value.shape[0]] = value
            target[value.shape[0] :] = 0
        else:
            raise ValueError(
                f"image weights: {name} is {tuple(value.shape)}, the video model's {tuple(target.shape)}"
            )
    return state
