"""Wan2.1's video transformer: diffusers' `WanTransformer3DModel` (T2V), module for module, so that the
state dict keys, shapes and dtype rules are the reference's and its published weights load by name.

The forward is vidforge's (`VideoTransformer.forward`, described in `vidforge.families.vidforge.dit`): a plain batch of latents
(B, C, T, H, W), a packed row of patch tokens (1, S, pt*ph*pw*C) with its `SequenceLayout`, or a
context-parallel rank's tokens with its `TokenShard`; attention goes through vidforge's dispatcher
(`Attend`), so packing, context parallel and every backend work as for the DiT.

What is Wan's and differs from the DiT:
- `noise_level` is the flow time t in [0, 1] (x_t = (1 - t) x0 + t noise); Wan was trained on the
  timestep 1000 t, which is what the sinusoids see (diffusers' pipelines pass that timestep). It may be
  one per token, (rows, S) like the tokens (diffusers' 2-D timestep, Wan2.2 TI2V's `expand_timesteps`:
  the image-conditioned first frame's tokens at 0): the embedding and the modulation are then per token.
- Captions: Wan's pipeline cuts each caption's umT5 states to its real tokens and pads with zeros to
  512, and cross-attention reads all of them, pads included (no key mask). Here positions where
  `text_mask` is False are zeroed and every caption position is attended; `drop_text` zeroes the whole
  caption (Wan has no learned null caption). Packed rows keep each sample's L caption positions.
- Modulation: one projection of the timestep embedding into six vectors (`condition_embedder.time_proj`,
  carried as `Conditioning.shared_modulation`) plus each block's learned `scale_shift_table`; no gate
  on cross-attention; the output layer shifts and scales by the timestep embedding itself.
- q and k are RMS-normalised across all heads (the whole hidden size) before RoPE. Under tensor
  parallel a rank holds only its heads: `norm_q`/`norm_k` then need the sum of squares of every rank
  (the parallel code replaces them; see the report of the wan change).
- Norms, modulation and residual adds run in float32 whatever the compute dtype (`.float()` /
  `.type_as` exactly where the reference has them), the RoPE tables are float32 (the reference's).
- The patch embedding is the reference's Conv3d weight (hidden, C, pt, ph, pw), applied as a Linear to
  patch tokens whose features are (pt, ph, pw, C): same numbers, and packed rows need no conv.

Pipeline parallel may set `patch_embedding` or `proj_out` to None (and drop `norm_out` and the top-level
`scale_shift_table` with it) and delete entries of `blocks` (a ModuleDict keyed by the block index, like
the reference's ModuleList names): a stage without `patch_embedding` takes hidden states, a stage
without `proj_out` returns them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.attention.sliding_tile import set_windows
from vidforge.attention.video_sparse import select_tiles
from vidforge.errors import UserInputError
from vidforge.families.wan import EPS, FREQ_DIM
from vidforge.models.backbone import VideoTransformer
from vidforge.models.layers import Conditioning, PixArtTextProjection, TimestepMLP
from vidforge.models.rope import apply_rope, rope_tables
from vidforge.models.scopes import Scope, tile_scope
from vidforge.models.token_inputs import TokenPlacement
from vidforge.profile.model import Model
from vidforge.tokens import Segments

TIMESTEP_SCALE = 1000.0  # Wan's timestep is 1000 t
MODULATION = 6  # (shift, scale, gate) for self-attention and for the feed-forward


def timestep_sinusoids(timestep: torch.Tensor, dim: int = FREQ_DIM) -> torch.Tensor:
    """diffusers' `get_timestep_embedding(t, dim, flip_sin_to_cos=True, downscale_freq_shift=0)`:
    (N,) -> (N, dim) float32, cosines first."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
    angle = timestep[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32, returned in the input's dtype (diffusers' FP32LayerNorm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


class PatchEmbedding(nn.Module):
    """The reference's Conv3d(C, hidden, kernel=stride=patch) parameters, applied to patch tokens."""

    def __init__(self, channels: int, hidden: int, patch: tuple[int, int, int]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, channels, *patch))
        self.bias = nn.Parameter(torch.empty(hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Conv3d weight (D, C, pt, ph, pw) -> Linear weight over features ordered (pt, ph, pw, C).
        return F.linear(tokens, self.weight.permute(0, 2, 3, 4, 1).flatten(1), self.bias)


class ImageEmbedding(nn.Module):
    """diffusers' WanImageEmbedding (Wan2.1-I2V, no position table): LayerNorm, GELU feed-forward of the
    image width, LayerNorm (both norms float32, affine, eps 1e-5: FP32LayerNorm's defaults there)."""

    def __init__(self, image_dim: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = FP32LayerNorm(image_dim)
        self.ff = FeedForward(image_dim, image_dim, hidden, approximate="none")
        self.norm2 = FP32LayerNorm(hidden)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.ff(self.norm1(image)))


class ConditionEmbedder(nn.Module):
    """diffusers' WanTimeTextImageEmbedding; the image branch only with `image_dim` (I2V)."""

    def __init__(self, hidden: int, text_dim: int, image_dim: int = 0) -> None:
        super().__init__()
        self.time_embedder = TimestepMLP(FREQ_DIM, hidden)
        self.time_proj = nn.Linear(hidden, MODULATION * hidden)
        self.text_embedder = PixArtTextProjection(text_dim, hidden)
        if image_dim:
            self.image_embedder = ImageEmbedding(image_dim, hidden)

    def forward(
        self, noise_level: torch.Tensor, text: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temb (N, hidden), time_proj (N, 6 hidden), projected text); a per-token noise level (rows, S)
        gives (rows, S, hidden) and (rows, S, 6 hidden), each token's own (diffusers' Wan2.2 TI2V path)."""
        features = timestep_sinusoids(noise_level.flatten() * TIMESTEP_SCALE)
        features = features.unflatten(0, noise_level.shape)
        temb = self.time_embedder(features.to(self.time_embedder.linear_1.weight.dtype)).type_as(text)
        return temb, self.time_proj(F.silu(temb)), self.text_embedder(text)


class WanAttention(nn.Module):
    """diffusers' WanAttention: to_q/to_k/to_v/to_out.0, q and k RMS-normalised across all heads.
    Self-attention (`forward(x, rope, scope)`) rotates q and k; cross-attention (`cross(x, text, mask)`)
    does not. With `image` (I2V's cross-attention) it also has add_k_proj/add_v_proj and norm_added_k:
    the queries attend to the image tokens on their own and that attention's output is added to the
    caption's before to_out. The head count comes from the projection width, so tensor parallel's local
    heads run the same code."""

    def __init__(self, hidden: int, heads: int, attend: Attend, image: bool = False) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(hidden, hidden)
        self.to_v = nn.Linear(hidden, hidden)
        self.to_out = nn.ModuleList([nn.Linear(hidden, hidden)])  # the reference's to_out.1 is a dropout
        self.norm_q = nn.RMSNorm(hidden, eps=EPS)
        self.norm_k = nn.RMSNorm(hidden, eps=EPS)
        if image:
            self.add_k_proj = nn.Linear(hidden, hidden)
            self.add_v_proj = nn.Linear(hidden, hidden)
            self.norm_added_k = nn.RMSNorm(hidden, eps=EPS)
        self.attend = attend
        self.tiles: tuple[tuple[int, int, int], tuple[int, int, int] | None] | None = None  # (tile, window)
        self.topk: int | None = None  # video sparse attention's key tiles per query tile (window None)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim))

    def project(self, x: torch.Tensor, context: torch.Tensor):
        """q from x, k and v from context, as (B, S, heads, head_dim)."""
        q = self._heads(self.norm_q(self.to_q(x)))
        k = self._heads(self.norm_k(self.to_k(context)))
        return q, k, self._heads(self.to_v(context))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], scope: Scope) -> torch.Tensor:
        q, k, v = self.project(x, x)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.tiles is not None:
            scope = tile_scope(scope, *self.tiles, x.device)
        qg, kg, vg = scope.gather(q), scope.gather(k), scope.gather(v)
        mask = scope.mask if self.topk is None else select_tiles(scope.mask, qg, kg, self.topk)
        return self.to_out[0](scope.scatter(self.attend(qg, kg, vg, mask)).flatten(-2).type_as(q))

    def cross(
        self,
        x: torch.Tensor,
        text: torch.Tensor,
        mask: AttentionMask,
        image: torch.Tensor | None = None,
        image_mask: AttentionMask = None,
    ) -> torch.Tensor:
        q, k, v = self.project(x, text)
        out = self.attend(q, k, v, mask).flatten(-2).type_as(q)
        if image is not None:
            k_image = self._heads(self.norm_added_k(self.add_k_proj(image)))
            v_image = self._heads(self.add_v_proj(image))
            out = out + self.attend(q, k_image, v_image, image_mask).flatten(-2).type_as(q)
        return self.to_out[0](out)


class FeedForward(nn.Module):
    """diffusers' FeedForward: net.0.proj, GELU (activation_fn "gelu-approximate": tanh; "gelu": exact),
    net.2 back to `out` (default: the input width)."""

    def __init__(self, hidden: int, inner: int, out: int | None = None, approximate: str = "tanh") -> None:
        super().__init__()
        first = nn.Module()
        first.proj = nn.Linear(hidden, inner)
        self.net = nn.ModuleList([first, nn.Dropout(0.0), nn.Linear(inner, out or hidden)])
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](F.gelu(self.net[0].proj(x), approximate=self.approximate))


class WanBlock(nn.Module):
    """diffusers' WanTransformerBlock: modulated self-attention, (normed) cross-attention without a
    gate, modulated feed-forward; the six modulation vectors are the block's table plus time_proj."""

    full_attention = "attn1"  # the layer sliding-tile attention windows (`set_windows`)

    def __init__(self, cfg: Model) -> None:
        super().__init__()
        hidden = cfg.hidden
        self.norm1 = FP32LayerNorm(hidden, EPS, elementwise_affine=False)
        self.attn1 = WanAttention(hidden, cfg.heads, Attend(cfg.attention, cfg.sdpa_backend))
        self.attn2 = WanAttention(
            hidden, cfg.heads, Attend(cfg.attention, cfg.sdpa_backend), bool(cfg.image_dim)
        )
        self.norm2 = (
            FP32LayerNorm(hidden, EPS, elementwise_affine=True) if cfg.cross_attn_norm else nn.Identity()
        )
        self.ffn = FeedForward(hidden, cfg.mlp_hidden)
        self.norm3 = FP32LayerNorm(hidden, EPS, elementwise_affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(1, MODULATION, hidden) / hidden**0.5)

    def forward(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        params = self.scale_shift_table.flatten(1) + cond.shared_modulation.float()
        shift, scale, gate, c_shift, c_scale, c_gate = cond.per_token(params).chunk(MODULATION, dim=-1)
        h = (self.norm1(x.float()) * (1 + scale) + shift).type_as(x)
        x = (x.float() + self.attn1(h, cond.rope, cond.scopes["full"]) * gate).type_as(x)
        h = self.norm2(x.float()).type_as(x)
        x = x + self.attn2.cross(h, cond.text, cond.text_mask, cond.image, cond.image_mask)
        h = (self.norm3(x.float()) * (1 + c_scale) + c_shift).type_as(x)
        return (x.float() + self.ffn(h).float() * c_gate).type_as(x)


class WanTransformer(VideoTransformer):
    """Wan2.1 transformer built from the profile's `model` section (family wan): T2V, or I2V with
    `condition_channels` (the input layer reads them after the latents' channels) and `image_dim`."""

    input_layers = ("patch_embedding",)
    output_layers = ("norm_out", "proj_out", "scale_shift_table")
    token_levels = True

    def __init__(self, config: Model) -> None:
        super().__init__()
        if config.family != "wan":
            raise UserInputError(f"WanTransformer builds model.family=wan, got {config.family!r}")
        self.config = config
        hidden = config.hidden
        channels = config.in_channels + config.condition_channels
        self.patch_embedding = PatchEmbedding(channels, hidden, config.patch)
        self.condition_embedder = ConditionEmbedder(hidden, config.text_dim, config.image_dim)
        self.blocks = nn.ModuleDict({str(i): WanBlock(config) for i in range(config.layers)})
        set_windows(self.blocks, config)
        self.norm_out = FP32LayerNorm(hidden, EPS, elementwise_affine=False)
        self.proj_out = nn.Linear(hidden, config.patch_dim)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, hidden) / hidden**0.5)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """A fresh model as diffusers initialises one: PyTorch's defaults for Linear and Conv3d (fan-in
        uniform), norms at one and zero, tables N(0, 1/hidden). Only for training from scratch; a Wan
        fine-tune loads the published weights over it. Callable again after building on the meta
        device and materialising with `to_empty`."""
        generic = (nn.Linear, nn.LayerNorm, nn.RMSNorm)
        for module in self.modules():
            if isinstance(module, generic):
                module.reset_parameters()
        embed = self.patch_embedding
        nn.init.kaiming_uniform_(embed.weight, a=math.sqrt(5))  # nn.Conv3d.reset_parameters
        fan_in = embed.weight[0].numel()
        nn.init.uniform_(embed.bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
        hidden = self.config.hidden
        for name, p in self.named_parameters():
            if name.endswith("scale_shift_table"):
                nn.init.normal_(p, std=hidden**-0.5)

    @property
    def param_dtype(self) -> torch.dtype:
        return self.condition_embedder.time_proj.weight.dtype

    # --- conditioning and the layers around the blocks (the forward is `VideoTransformer.forward`) ---

    def conditioning(
        self,
        place: TokenPlacement,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        drop_text: torch.Tensor | None,
    ) -> Conditioning:
        """Wan's content in the DiT's `Conditioning`: `time` is Wan's temb, `shared_modulation` its
        time_proj (N, 6 hidden); every caption position is a key (pads zeroed), float32 RoPE tables."""
        text = zero_padded_text(text, text_mask, drop_text)
        temb, time_proj, text_tokens = self.condition_embedder(noise_level, text)
        if place.query_lens is not None:
            samples, length = text.shape[:2]
            text_tokens = text_tokens.flatten(0, 1).unsqueeze(0)
            cross_mask = Segments(place.query_lens, (length,) * samples)
        else:
            cross_mask = None
        rope = rope_tables(place.positions, self.config.head_dim, self.config.rope_theta, torch.float32)
        return Conditioning(
            temb, time_proj, text_tokens, cross_mask, rope, place.scopes, place.token_sample, place.positions
        )

    def image_conditioning(
        self, place: TokenPlacement, image: torch.Tensor
    ) -> tuple[torch.Tensor, AttentionMask]:
        """I2V's image tokens through `condition_embedder.image_embedder`; every one is a key (no mask), and a
        packed row keeps each sample's image tokens in sample order, as it does their captions."""
        if not self.config.image_dim:
            return super().image_conditioning(place, image)
        tokens = self.condition_embedder.image_embedder(image)
        if place.query_lens is None:
            return tokens, None
        samples, length = image.shape[:2]
        return tokens.flatten(0, 1).unsqueeze(0), Segments(place.query_lens, (length,) * samples)

    def embed(self, tokens: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.patch_embedding(tokens)

    def head(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Output norm shifted and scaled by the table plus temb (not time_proj), then proj_out."""
        table = self.scale_shift_table.flatten(1)
        shift, scale = cond.per_token(table + torch.cat([cond.time, cond.time], dim=-1)).chunk(2, dim=-1)
        return self.proj_out((self.norm_out(h.float()) * (1 + scale) + shift).type_as(h))


def zero_padded_text(
    text: torch.Tensor, text_mask: torch.Tensor | None, drop_text: torch.Tensor | None
) -> torch.Tensor:
    """Wan's captions: zeros where the mask says padding, and a dropped caption all zeros. Done with
    `where`, so no host synchronisation."""
    keep = text_mask
    if drop_text is not None:
        drop = drop_text.to(torch.bool, copy=False)
        if drop.shape != (text.shape[0],):
            raise ValueError(
                f"drop_text must be (N,) = ({text.shape[0]},) bool, got {tuple(drop_text.shape)}"
            )
        keep = ~drop[:, None] if keep is None else keep & ~drop[:, None]
    if keep is None:
        return text
    return torch.where(keep[..., None], text, torch.zeros((), dtype=text.dtype, device=text.device))
