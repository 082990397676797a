"""HunyuanVideo-1.5's transformer: diffusers' `HunyuanVideo15Transformer3DModel` module for module, so that
the state dict keys, shapes and dtype rules are the reference's and its published weights load by name.

The forward is vidforge's (`VideoTransformer.forward`): latents (B, C, T, H, W) or their patch tokens with
a grid, the condition latents beside them (`condition`: the first frame's latents and mask; None is the
text-to-video pipeline's zeros) and the SigLIP image embedding (`image`; None is text-to-video: the
reference then masks the image tokens out, so leaving them out is the same). Attention runs through
vidforge's dispatcher (`Attend`). Under context parallel (`shard`, plain batches) a rank holds its share of
the video tokens and the whole caption stream (`joint_keys`).

What is HunyuanVideo-1.5's and differs from the DiT and Wan:
- Double-stream blocks (MM-DiT): the caption tokens are a second residual stream with their own
  modulation, projections and feed-forward, and one joint attention runs over [video, caption]. Here
  both streams travel as one hidden-state tensor, [video tokens, caption tokens] along the sequence, so a
  block is `block(h, cond)` like every family's; `head` keeps the video part.
- The caption stream is [image tokens, glyph (ByT5) tokens, MLLM (Qwen2.5-VL) tokens], each projected by
  its own embedder plus its row of `cond_type_embed`; the MLLM's first runs through a token refiner
  (self-attention blocks gated by the timestep and the caption's masked mean). The reference reorders
  valid tokens first and masks queries as well as keys; attention is permutation-equivariant and a
  padded caption query is read by nothing that reaches the video, so a key mask (`KeyPadding`) over the
  unordered stream gives the same video output.
- `noise_level` is the flow time t in [0, 1]; the sinusoids see 1000 t, the pipeline's timestep.
- RoPE rotates q and k of the video tokens only, its head channels split (16, 56, 56) over (t, h, w) with
  theta 256; tables and rotation in float32 (the reference's `apply_rotary_emb` upcasts, also from
  float64), q/k RMSNorm's statistics in float32 (diffusers' `RMSNorm`).
- The output projection's features are (C, pt, ph, pw), not vidforge's patch order (pt, ph, pw, C):
  `head` reorders them (the published patch is 1x1x1, where both agree).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.errors import UserInputError
from vidforge.families.hunyuan15.model import FAMILY, TITLE, HunyuanVideo15Model
from vidforge.families.plain_batches import caption_dropout_refusal, packing_refusal
from vidforge.models.backbone import VideoTransformer
from vidforge.models.layers import Conditioning, TimestepMLP
from vidforge.models.token_inputs import TokenPlacement
from vidforge.parallel.joint_attention import JointShard
from vidforge.tokens import ContextShard, KeyPadding

FREQ_DIM = 256  # sinusoidal features of the timestep
TIMESTEP_SCALE = 1000.0  # the pipeline's timestep is 1000 t
EPS = 1e-6  # the blocks' and refiner's norms
MODULATION = 6  # (shift, scale, gate) for attention and for the feed-forward, per stream
IMAGE, GLYPH, MLLM = 2, 1, 0  # rows of cond_type_embed


def timestep_sinusoids(timestep: torch.Tensor, dim: int = FREQ_DIM) -> torch.Tensor:
    """diffusers' `Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0)`: (N,) -> (N, dim) float32."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
    angle = timestep[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def rope_tables(
    positions: torch.Tensor, axes: tuple[int, int, int], theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (S, head_dim / 2) in float32 for integer positions (S, 3), axis a rotating axes[a]
    channels (diffusers' `get_1d_rotary_pos_embed` per axis, float32 frequencies)."""
    angles = []
    for axis, dim in enumerate(axes):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
        angles.append(torch.outer(positions[:, axis].float(), freqs))
    angle = torch.cat(angles, dim=-1)
    return angle.cos(), angle.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x[2i], x[2i+1]) of x (B, S, heads, head_dim) in float32 whatever x's dtype
    (the reference's rule), returned in x's dtype."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2).to(x.dtype)


class RMSNorm(nn.Module):
    """diffusers' RMSNorm: the mean square in float32, the weight applied in half precision when it is."""

    def __init__(self, dim: int, eps: float = EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        out = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            out = out.to(self.weight.dtype)
        return (out * self.weight).to(x.dtype)


class FeedForward(nn.Module):
    """diffusers' FeedForward: net.0.proj, the activation ("gelu-approximate": GELU tanh; "linear-silu":
    SiLU), net.2."""

    def __init__(self, hidden: int, inner: int, activation: str) -> None:
        super().__init__()
        first = nn.Module()
        first.proj = nn.Linear(hidden, inner)
        self.net = nn.ModuleList([first, nn.Dropout(0.0), nn.Linear(inner, hidden)])
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net[0].proj(x)
        h = F.silu(h) if self.activation == "silu" else F.gelu(h, approximate="tanh")
        return self.net[2](h)


def _heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    return x.unflatten(-1, (-1, head_dim))


def joint_keys(place: TokenPlacement, caption: torch.Tensor) -> AttentionMask:
    """The joint attention's mask over [video, caption] given the caption's valid keys (N, L): every video
    token is a key. Under context parallel (the rank holds part of the video tokens, all of the caption) a
    `JointShard`, which the installed cp attention evaluates (`vidforge.parallel.joint_attention`)."""
    full = place.scopes["full"].mask
    if isinstance(full, ContextShard):
        return JointShard("full", full.shard, caption)
    video = torch.ones((caption.shape[0], place.positions.shape[0]), dtype=torch.bool, device=caption.device)
    return KeyPadding(torch.cat([video, caption], dim=1))


# --- the caption's embedders ---------------------------------------------------------------------


class RefinerAttention(nn.Module):
    """diffusers' Attention as the token refiner builds it: to_q/to_k/to_v/to_out.0, no q/k norm."""

    def __init__(self, hidden: int, heads: int, attend: Attend) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(hidden, hidden)
        self.to_v = nn.Linear(hidden, hidden)
        self.to_out = nn.ModuleList([nn.Linear(hidden, hidden)])
        self.attend = attend

    def forward(self, x: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        q, k, v = (_heads(proj(x), self.head_dim) for proj in (self.to_q, self.to_k, self.to_v))
        return self.to_out[0](self.attend(q, k, v, mask).flatten(-2).type_as(q))


class GateNorm(nn.Module):
    """diffusers' HunyuanVideo15AdaNorm: (attention gate, feed-forward gate) from the refiner's temb."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, 2 * hidden)

    def forward(self, temb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate_msa, gate_mlp = self.linear(F.silu(temb)).chunk(2, dim=1)
        return gate_msa.unsqueeze(1), gate_mlp.unsqueeze(1)


class RefinerBlock(nn.Module):
    """diffusers' HunyuanVideo15IndividualTokenRefinerBlock: gated self-attention and SiLU feed-forward."""

    def __init__(self, hidden: int, heads: int, inner: int, attend: Attend) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden, eps=EPS)
        self.attn = RefinerAttention(hidden, heads, attend)
        self.norm2 = nn.LayerNorm(hidden, eps=EPS)
        self.ff = FeedForward(hidden, inner, "silu")
        self.norm_out = GateNorm(hidden)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        gate_msa, gate_mlp = self.norm_out(temb)
        x = x + self.attn(self.norm1(x), mask) * gate_msa
        return x + self.ff(self.norm2(x)) * gate_mlp


class TimeTextEmbedding(nn.Module):
    """diffusers' CombinedTimestepTextProjEmbeddings: the timestep's MLP plus the pooled caption's
    (PixArtAlphaTextProjection with SiLU)."""

    def __init__(self, hidden: int, text_dim: int) -> None:
        super().__init__()
        self.timestep_embedder = TimestepMLP(FREQ_DIM, hidden)
        self.text_embedder = TimestepMLP(text_dim, hidden)  # linear_1, SiLU, linear_2 as well

    def forward(self, sinusoids: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.timestep_embedder(sinusoids.to(pooled.dtype)) + self.text_embedder(pooled)


class TokenRefiner(nn.Module):
    """diffusers' HunyuanVideo15TokenRefiner (`context_embedder`): the MLLM's states projected to the
    width and refined by `refiner_layers` blocks conditioned on the timestep and the masked mean."""

    def __init__(self, cfg: HunyuanVideo15Model) -> None:
        super().__init__()
        hidden = cfg.hidden
        self.time_text_embed = TimeTextEmbedding(hidden, cfg.text_dim)
        self.proj_in = nn.Linear(cfg.text_dim, hidden)
        self.token_refiner = nn.Module()
        self.token_refiner.refiner_blocks = nn.ModuleList(
            RefinerBlock(hidden, cfg.heads, 4 * hidden, Attend(cfg.attention, cfg.sdpa_backend))
            for _ in range(cfg.refiner_layers)
        )

    def forward(self, text: torch.Tensor, sinusoids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.float().unsqueeze(-1)
        pooled = ((text * weights).sum(dim=1) / weights.sum(dim=1)).to(text.dtype)
        temb = self.time_text_embed(sinusoids, pooled)
        h = self.proj_in(text)
        keys = KeyPadding(mask)
        for block in self.token_refiner.refiner_blocks:
            h = block(h, temb, keys)
        return h


class GlyphProjection(nn.Module):
    """diffusers' HunyuanVideo15ByT5TextProjection (`context_embedder_2`): LayerNorm, three Linears with
    GELU between."""

    def __init__(self, text_2_dim: int, hidden: int, inner: int = 2048) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(text_2_dim)
        self.linear_1 = nn.Linear(text_2_dim, inner)
        self.linear_2 = nn.Linear(inner, inner)
        self.linear_3 = nn.Linear(inner, hidden)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.linear_1(self.norm(text)))
        return self.linear_3(F.gelu(self.linear_2(h)))


class ImageProjection(nn.Module):
    """diffusers' HunyuanVideo15ImageProjection (`image_embedder`): LayerNorm, Linear, GELU, Linear,
    LayerNorm."""

    def __init__(self, image_dim: int, hidden: int) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(image_dim)
        self.linear_1 = nn.Linear(image_dim, image_dim)
        self.linear_2 = nn.Linear(image_dim, hidden)
        self.norm_out = nn.LayerNorm(hidden)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.norm_out(self.linear_2(F.gelu(self.linear_1(self.norm_in(image)))))


# --- the double-stream blocks --------------------------------------------------------------------


class JointAttention(nn.Module):
    """diffusers' Attention with added K/V (HunyuanVideo15AttnProcessor2_0): video q/k/v (to_*) and caption
    q/k/v (add_*_proj), each q and k RMS-normalised per head, RoPE on the video's; one attention over
    [video, caption]; to_out.0 and to_add_out project each stream's part back."""

    def __init__(self, hidden: int, heads: int, attend: Attend) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(hidden, hidden)
        self.to_v = nn.Linear(hidden, hidden)
        self.to_out = nn.ModuleList([nn.Linear(hidden, hidden)])
        self.norm_q = RMSNorm(self.head_dim)
        self.norm_k = RMSNorm(self.head_dim)
        self.add_q_proj = nn.Linear(hidden, hidden)
        self.add_k_proj = nn.Linear(hidden, hidden)
        self.add_v_proj = nn.Linear(hidden, hidden)
        self.to_add_out = nn.Linear(hidden, hidden)
        self.norm_added_q = RMSNorm(self.head_dim)
        self.norm_added_k = RMSNorm(self.head_dim)
        self.attend = attend

    def forward(
        self, video: torch.Tensor, text: torch.Tensor, cond: Conditioning
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.head_dim
        cos, sin = cond.rope
        q = rotate(self.norm_q(_heads(self.to_q(video), d)), cos, sin)
        k = rotate(self.norm_k(_heads(self.to_k(video), d)), cos, sin)
        v = _heads(self.to_v(video), d)
        text_q = self.norm_added_q(_heads(self.add_q_proj(text), d))
        text_k = self.norm_added_k(_heads(self.add_k_proj(text), d))
        text_v = _heads(self.add_v_proj(text), d)
        out = self.attend(
            torch.cat([q, text_q], dim=1),
            torch.cat([k, text_k], dim=1),
            torch.cat([v, text_v], dim=1),
            cond.text_mask,
        )
        out = out.flatten(-2).type_as(q)
        video_out, text_out = out.split([video.shape[1], text.shape[1]], dim=1)
        return self.to_out[0](video_out), self.to_add_out(text_out)


class AdaNormZero(nn.Module):
    """diffusers' AdaLayerNormZero (layer_norm): six vectors from temb; `norm` without affine."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, MODULATION * hidden)
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=EPS)

    def forward(self, x: torch.Tensor, temb: torch.Tensor):
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = self.linear(F.silu(temb)).chunk(
            MODULATION, dim=1
        )
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None], gate, shift_mlp, scale_mlp, gate_mlp


class DoubleStreamBlock(nn.Module):
    """diffusers' HunyuanVideo15TransformerBlock over h = [video, caption] (the caption's length is
    cond.text's)."""

    def __init__(self, cfg: HunyuanVideo15Model) -> None:
        super().__init__()
        hidden = cfg.hidden
        self.norm1 = AdaNormZero(hidden)
        self.norm1_context = AdaNormZero(hidden)
        self.attn = JointAttention(hidden, cfg.heads, Attend(cfg.attention, cfg.sdpa_backend))
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=EPS)
        self.ff = FeedForward(hidden, cfg.mlp_hidden, "gelu-tanh")
        self.norm2_context = nn.LayerNorm(hidden, elementwise_affine=False, eps=EPS)
        self.ff_context = FeedForward(hidden, cfg.mlp_hidden, "gelu-tanh")

    def forward(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        video, text = h.split([h.shape[1] - cond.text.shape[1], cond.text.shape[1]], dim=1)
        temb = cond.time
        norm_video, gate, shift_mlp, scale_mlp, gate_mlp = self.norm1(video, temb)
        norm_text, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(text, temb)
        attn_video, attn_text = self.attn(norm_video, norm_text, cond)
        video = video + attn_video * gate.unsqueeze(1)
        text = text + attn_text * c_gate.unsqueeze(1)
        norm_video = self.norm2(video) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        norm_text = self.norm2_context(text) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        video = video + gate_mlp.unsqueeze(1) * self.ff(norm_video)
        text = text + c_gate_mlp.unsqueeze(1) * self.ff_context(norm_text)
        return torch.cat([video, text], dim=1)


class OutputNorm(nn.Module):
    """diffusers' AdaLayerNormContinuous (no affine, eps 1e-6): scale then shift from temb."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, 2 * hidden)
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=EPS)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(F.silu(temb).to(x.dtype)).chunk(2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class PatchEmbedding(nn.Module):
    """diffusers' HunyuanVideo15PatchEmbed: a Conv3d(kernel = stride = patch) named `proj`, applied as a
    Linear to patch tokens whose features are (pt, ph, pw, C): same numbers, no conv."""

    def __init__(self, channels: int, hidden: int, patch: tuple[int, int, int]) -> None:
        super().__init__()
        self.proj = nn.Conv3d(channels, hidden, kernel_size=patch, stride=patch)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.linear(tokens, self.proj.weight.permute(0, 2, 3, 4, 1).flatten(1), self.proj.bias)


class HunyuanVideo15Transformer(VideoTransformer):
    """HunyuanVideo-1.5's transformer from the family's `model` section (text- and image-to-video alike:
    the published T2V and I2V networks have the same modules)."""

    input_layers = ("x_embedder",)
    output_layers = ("norm_out", "proj_out")

    def __init__(self, config: HunyuanVideo15Model) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden
        self.x_embedder = PatchEmbedding(config.in_channels + config.condition_channels, hidden, config.patch)
        self.image_embedder = ImageProjection(config.image_dim, hidden)
        self.context_embedder = TokenRefiner(config)
        self.context_embedder_2 = GlyphProjection(config.text_2_dim, hidden)
        self.time_embed = nn.Module()
        self.time_embed.timestep_embedder = TimestepMLP(FREQ_DIM, hidden)
        self.cond_type_embed = nn.Embedding(3, hidden)
        self.transformer_blocks = nn.ModuleDict(
            {str(i): DoubleStreamBlock(config) for i in range(config.layers)}
        )
        self.norm_out = OutputNorm(hidden)
        self.proj_out = nn.Linear(hidden, config.patch_dim)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """A fresh model as diffusers initialises one: PyTorch's defaults (Linear and Conv3d fan-in uniform,
        norms at one and zero, the type embedding N(0, 1)). Only for training from scratch; a fine-tune
        loads the published weights over it. Callable again after building on the meta device and
        materialising with `to_empty`."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Conv3d | nn.LayerNorm | nn.Embedding):
                module.reset_parameters()
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @property
    def blocks(self) -> nn.ModuleDict:  # the shared forward's name for the stack; diffusers' is kept
        return self.transformer_blocks

    @property
    def param_dtype(self) -> torch.dtype:
        return self.proj_out.weight.dtype

    def forward(self, x: torch.Tensor, noise_level: torch.Tensor, text: torch.Tensor, *args, **kwargs):
        """`VideoTransformer.forward`; `condition` None is text-to-video's zeros (the pipeline's)."""
        shard = kwargs.get("shard")
        if kwargs.get("layout") is not None or (shard is not None and shard.packed):
            raise UserInputError(packing_refusal(FAMILY))
        if kwargs.get("condition") is None and self.config.condition_channels:
            shape = list(x.shape)
            shape[1 if x.ndim == 5 else 2] = self.config.condition_channels * (
                1 if x.ndim == 5 else math.prod(self.config.patch)
            )
            kwargs["condition"] = x.new_zeros(shape)
        return super().forward(x, noise_level, text, *args, **kwargs)

    def conditioning(
        self,
        place: TokenPlacement,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        drop_text: torch.Tensor | None,
    ) -> Conditioning:
        """`time`: temb (N, hidden); `text`: the caption stream [glyph, MLLM] (image tokens join in
        `image_conditioning`); `text_mask`: the joint attention's key mask over [video, caption]."""
        if drop_text is not None and bool(drop_text.any()):  # (guidance's branch reads the encoded "")
            raise UserInputError(caption_dropout_refusal(TITLE))
        cfg = self.config
        if text_mask is None:
            text_mask = torch.ones(text.shape[:2], dtype=torch.bool, device=text.device)
        glyphs = cfg.text_2_tokens
        mllm, mllm_mask = text[:, : text.shape[1] - glyphs], text_mask[:, : text.shape[1] - glyphs]
        glyph, glyph_mask = text[:, mllm.shape[1] :, : cfg.text_2_dim], text_mask[:, mllm.shape[1] :]
        sinusoids = timestep_sinusoids(noise_level * TIMESTEP_SCALE)
        dtype = self.param_dtype
        temb = self.time_embed.timestep_embedder(sinusoids.to(dtype))
        types = self.cond_type_embed.weight
        # the pipeline hands the transformer its captions in the weights' dtype (stored ones are float16)
        stream = torch.cat(
            [
                self.context_embedder_2(glyph.to(dtype)) + types[GLYPH],
                self.context_embedder(mllm.to(dtype), sinusoids, mllm_mask) + types[MLLM],
            ],
            dim=1,
        )
        keys = joint_keys(place, torch.cat([glyph_mask, mllm_mask], dim=1))
        rope = rope_tables(place.positions, cfg.rope_axes, cfg.rope_theta)
        return Conditioning(temb, None, stream, keys, rope, place.scopes, place.token_sample, place.positions)

    def image_conditioning(self, place: TokenPlacement, image: torch.Tensor) -> tuple[torch.Tensor, None]:
        """The image tokens, projected, as the caption stream's first part (image_mask stays None: the
        `conditioning` hook below puts them into the stream and the key mask)."""
        return self.image_embedder(image.to(self.param_dtype)) + self.cond_type_embed.weight[IMAGE], None

    def condition(self, noise_level, text, text_mask=None, drop_text=None, *, image=None, **where):
        """`VideoTransformer.condition`, then the image tokens (I2V) put in front of the caption stream,
        every one a key."""
        cond = super().condition(noise_level, text, text_mask, drop_text, image=image, **where)
        if cond.image is None:
            return cond
        valid = torch.ones(cond.image.shape[:2], dtype=torch.bool, device=cond.image.device)
        if isinstance(cond.text_mask, JointShard):
            keys = replace(cond.text_mask, keys=torch.cat([valid, cond.text_mask.keys], dim=1))
        else:
            video, caption = cond.text_mask.mask.split(
                [cond.text_mask.mask.shape[1] - cond.text.shape[1], cond.text.shape[1]], dim=1
            )
            keys = KeyPadding(torch.cat([video, valid, caption], dim=1))
        return replace(cond, text=torch.cat([cond.image, cond.text], dim=1), text_mask=keys, image=None)

    def embed(self, tokens: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return torch.cat([self.x_embedder(tokens), cond.text.to(tokens.dtype)], dim=1)

    def head(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The video part through the output norm and proj_out, its features reordered from the reference's
        (C, pt, ph, pw) to vidforge's patch order (pt, ph, pw, C)."""
        video = h[:, : h.shape[1] - cond.text.shape[1]]
        out = self.proj_out(self.norm_out(video, cond.time))
        return out.unflatten(-1, (self.config.in_channels, -1)).transpose(-1, -2).flatten(-2)
