"""LTX-2's transformer, the video path: diffusers' `LTX2VideoTransformer3DModel` module for module where the
video stream is concerned, so the state dict keys, shapes and dtype rules are the reference's and the
published weights' video part loads by name (`video_state` drops the audio stream's tensors).

The published network is joint audio-video: every block runs a video and an audio stream, and the video
stream reads the audio one only through the audio-to-video cross-attention. diffusers turns that off with
`isolate_modalities=True` (LTX-core builds a video-only model the same way); the video output is then a
function of the video latents, the caption and the time alone, and that function is what this module
computes. The forward is vidforge's (`VideoTransformer.forward`); attention runs through its dispatcher.

What is LTX-2's and differs from the DiT and Wan:
- RoPE positions are fractional pixel-space coordinates: each latent position mapped through the VAE's
  compression (the causal first frame shifted back and clamped at 0), time in seconds at `frame_rate`, the
  patch's midpoint, divided by `rope_base`, then 2p - 1; frequencies theta^linspace(0, 1) * pi/2 over the
  whole width (not per head), applied to q and k before they are split into heads ("interleaved" pairs
  neighbours, "split" pairs the two halves of each head). Tables and rotation run in float32 whatever
  the model's dtype (the reference's `x.float()`), and so do the blocks' RMSNorm statistics.
- q/k RMSNorm across all heads (`torch.nn.RMSNorm(hidden)`), not per head.
- The blocks' norms are weightless RMSNorm; the modulation is Wan's (a shared 6 x hidden projection of the
  time embedding plus each block's `scale_shift_table`). LTX-2.3 (`prompt_modulation`) modulates the
  caption cross-attention too: its query and output by three more rows, the caption by a table plus,
  per step, a projection of the per-sample noise level (`LTX2Conditioning.prompt_time`: the pipeline's
  `sigma`, which is the noisy tokens' level, so the largest of a per-token level's); `gated_attention`
  gates each head's attention output.
- `noise_level` is the flow time t in [0, 1]; the sinusoids see 1000 t, the pipeline's timestep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.errors import UserInputError
from vidforge.families.ltx2.model import LTX2Model
from vidforge.families.ltx2.published import is_audio
from vidforge.models.backbone import VideoTransformer
from vidforge.models.layers import Conditioning, PixArtTextProjection, TimestepMLP
from vidforge.models.token_inputs import TokenPlacement
from vidforge.tokens import KeyPadding

FREQ_DIM = 256  # sinusoidal features of the timestep
TIMESTEP_SCALE = 1000.0  # the pipeline's timestep is 1000 t (timestep_scale_multiplier)
MODULATION = 6  # (shift, scale, gate) for self-attention and for the feed-forward
PROMPT_MODULATION = 3  # (shift, scale, gate) of the caption cross-attention's query (LTX-2.3)
OUT_EPS = 1e-6  # norm_out's


def video_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The video path's part of a published LTX2VideoTransformer3DModel state dict."""
    return {key: value for key, value in state.items() if not is_audio(key)}


def timestep_sinusoids(timestep: torch.Tensor, dim: int = FREQ_DIM) -> torch.Tensor:
    """diffusers' `Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0)`: (M,) -> (M, dim) float32."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
    angle = timestep[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


def rope_tables(positions: torch.Tensor, cfg: LTX2Model) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin in float32 for integer latent positions (S, 3): (S, hidden) for "interleaved", (heads, S,
    head_dim / 2) for "split"; diffusers' LTX2AudioVideoRotaryPosEmbed (prepare_video_coords, then
    forward), its operations in its order so that float32 rounding agrees."""
    scale = torch.tensor(cfg.vae_scale, device=positions.device)
    starts = positions.float()
    bounds = torch.stack([starts, starts + 1.0], dim=-1) * scale.view(1, 3, 1)  # (S, 3, [start, end))
    time = (bounds[:, 0] + cfg.causal_offset - cfg.vae_scale[0]).clamp(min=0) / cfg.frame_rate
    bounds = torch.cat([time[:, None], bounds[:, 1:]], dim=1)
    middle = (bounds[..., 0] + bounds[..., 1]) / 2.0
    grid = torch.stack([middle[:, i] / cfg.rope_base[i] for i in range(3)], dim=-1)  # (S, 3)
    ladder = torch.float64 if cfg.rope_double_precision else torch.float32
    steps = cfg.hidden // 6
    powers = torch.pow(cfg.rope_theta, torch.linspace(0.0, 1.0, steps, dtype=ladder, device=positions.device))
    freqs = (powers * torch.pi / 2.0).to(torch.float32)
    angle = ((grid.unsqueeze(-1) * 2 - 1) * freqs).transpose(-1, -2).flatten(1)  # (S, 3 * steps)
    cos, sin = angle.cos(), angle.sin()
    if cfg.rope_type == "interleaved":
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        pad = cfg.hidden % 6
    else:
        pad = cfg.hidden // 2 - cos.shape[-1]
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :pad]), sin], dim=-1)
    if cfg.rope_type == "split":
        cos = cos.unflatten(-1, (cfg.heads, -1)).transpose(0, 1)
        sin = sin.unflatten(-1, (cfg.heads, -1)).transpose(0, 1)
    return cos, sin


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], rope_type: str) -> torch.Tensor:
    """RoPE on q or k (B, S, hidden) in float32, returned in x's dtype (diffusers'
    apply_interleaved_rotary_emb / apply_split_rotary_emb)."""
    cos, sin = rope
    if rope_type == "interleaved":
        real, imag = x.unflatten(2, (-1, 2)).unbind(-1)
        rotated = torch.stack([-imag, real], dim=-1).flatten(2)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
    heads = cos.shape[0]
    split = x.unflatten(2, (heads, -1)).transpose(1, 2)  # (B, heads, S, head_dim)
    split = split.reshape(*split.shape[:-1], 2, -1).float()
    first, second = split[..., :1, :], split[..., 1:, :]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = split * cos
    out[..., :1, :].addcmul_(-sin, second)
    out[..., 1:, :].addcmul_(sin, first)
    return out.flatten(-2).transpose(1, 2).flatten(2).to(x.dtype)


def rope_columns(
    rope: tuple[torch.Tensor, torch.Tensor], width: int, head_dim: int, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables of q's and k's columns [rank x width, (rank + 1) x width): a tensor-parallel rank's share
    of the width (its heads), the whole tables when q holds the whole width. "interleaved" tables are per
    feature (S, hidden), "split" ones per head (heads, S, head_dim / 2); either way a rank rotates exactly
    its own features with the whole width's angles."""
    cos, sin = rope
    if cos.ndim == 2:  # interleaved: (S, hidden)
        if cos.shape[-1] == width:
            return rope
        return cos[:, rank * width : (rank + 1) * width], sin[:, rank * width : (rank + 1) * width]
    heads = width // head_dim
    if cos.shape[0] == heads:
        return rope
    return cos[rank * heads : (rank + 1) * heads], sin[rank * heads : (rank + 1) * heads]


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """diffusers' weightless RMSNorm: the mean square in float32, back in x's dtype."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return (x * torch.rsqrt(variance + eps)).to(x.dtype)


@dataclass(eq=False)
class LTX2Conditioning(Conditioning):
    """`Conditioning` and, with per-step prompt modulation, its time term (N, 1, 2 x hidden)."""

    prompt_time: torch.Tensor | None = None


class AdaLayerNormSingle(nn.Module):
    """diffusers' LTX2AdaLayerNormSingle (`time_embed`, `prompt_adaln`): the timestep's embedding
    (emb.timestep_embedder) and its projection to `rows` x hidden modulation (linear)."""

    def __init__(self, hidden: int, rows: int = MODULATION) -> None:
        super().__init__()
        self.emb = nn.Module()
        self.emb.timestep_embedder = TimestepMLP(FREQ_DIM, hidden)
        self.linear = nn.Linear(hidden, rows * hidden)

    def forward(self, sinusoids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        embedded = self.emb.timestep_embedder(sinusoids.to(dtype))
        return self.linear(F.silu(embedded)), embedded


class Attention(nn.Module):
    """diffusers' LTX2Attention: to_q/to_k/to_v/to_out.0, q and k RMS-normalised across all heads (norm_q,
    norm_k), RoPE on them when given (self-attention), each head's output gated by 2 sigmoid(to_gate_logits
    of the query's input) with `gated_attention`."""

    def __init__(self, hidden: int, heads: int, context_dim: int, cfg: LTX2Model) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        self.rope_type = cfg.rope_type
        self.norm_q = nn.RMSNorm(hidden, eps=cfg.eps)
        self.norm_k = nn.RMSNorm(hidden, eps=cfg.eps)
        self.to_q = nn.Linear(hidden, hidden)
        self.to_k = nn.Linear(context_dim, hidden)
        self.to_v = nn.Linear(context_dim, hidden)
        self.to_out = nn.ModuleList([nn.Linear(hidden, hidden)])
        self.to_gate_logits = nn.Linear(hidden, heads) if cfg.gated_attention else None
        self.attend = Attend(cfg.attention, cfg.sdpa_backend)
        self.tp_rank = 0  # whose share of the width q/k/v hold under tensor parallel (its plan sets it)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        mask: AttentionMask,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        q, k, v = self.norm_q(self.to_q(x)), self.norm_k(self.to_k(context)), self.to_v(context)
        if rope is not None:
            rope = rope_columns(rope, q.shape[-1], self.head_dim, self.tp_rank)
            q, k = rotate(q, rope, self.rope_type), rotate(k, rope, self.rope_type)
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))
        out = self.attend(q, k, v, mask).flatten(-2).type_as(q)
        if self.to_gate_logits is not None:
            gates = 2.0 * torch.sigmoid(self.to_gate_logits(x))
            out = (out.unflatten(-1, (-1, self.head_dim)) * gates.unsqueeze(-1)).flatten(-2)
        return self.to_out[0](out)


class FeedForward(nn.Module):
    """diffusers' FeedForward ("gelu-approximate", 4x): net.0.proj, GELU (tanh), net.2."""

    def __init__(self, hidden: int, bias: bool = True) -> None:
        super().__init__()
        first = nn.Module()
        first.proj = nn.Linear(hidden, 4 * hidden, bias=bias)
        self.net = nn.ModuleList([first, nn.Dropout(0.0), nn.Linear(4 * hidden, hidden, bias=bias)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](F.gelu(self.net[0].proj(x), approximate="tanh"))


class Block(nn.Module):
    """diffusers' LTX2VideoTransformerBlock, its video stream with the audio cross-attention off:
    modulated self-attention, caption cross-attention (modulated with `prompt_modulation`), modulated
    feed-forward."""

    def __init__(self, cfg: LTX2Model) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.rows = MODULATION + (PROMPT_MODULATION if cfg.prompt_modulation else 0)
        self.attn1 = Attention(cfg.hidden, cfg.heads, cfg.hidden, cfg)
        self.attn2 = Attention(cfg.hidden, cfg.heads, cfg.hidden, cfg)
        self.ff = FeedForward(cfg.hidden, cfg.ff_bias)
        self.scale_shift_table = nn.Parameter(torch.randn(self.rows, cfg.hidden) / cfg.hidden**0.5)
        if cfg.prompt_modulation:
            self.prompt_scale_shift_table = nn.Parameter(torch.randn(2, cfg.hidden))

    def forward(self, h: torch.Tensor, cond: LTX2Conditioning) -> torch.Tensor:
        # the table joins the per-sample rows before they meet the tokens (Wan's order), so that sequence
        # parallel's `per_token` sums its gradient over the ranks' tokens as well
        rows = cond.per_token(self.scale_shift_table.flatten() + cond.shared_modulation)
        params = rows.unflatten(-1, (self.rows, -1)).unbind(dim=2)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = params[:MODULATION]
        x = rms_norm(h, self.eps) * (1 + scale_msa) + shift_msa
        h = h + self.attn1(x, x, cond.scopes["full"].mask, cond.rope) * gate_msa
        h = h + self.cross_attention(h, cond, params[MODULATION:])
        x = rms_norm(h, self.eps) * (1 + scale_mlp) + shift_mlp
        return h + self.ff(x) * gate_mlp

    def cross_attention(self, h: torch.Tensor, cond: LTX2Conditioning, query_params) -> torch.Tensor:
        """The caption cross-attention's output, modulated as the reference does with `prompt_modulation`."""
        x, text = rms_norm(h, self.eps), cond.text
        if not query_params:
            return self.attn2(x, text, cond.text_mask)
        shift_q, scale_q, gate_q = query_params
        if cond.prompt_time is not None:
            table = self.prompt_scale_shift_table[None, None] + cond.prompt_time.unflatten(-1, (2, -1))
        else:
            table = self.prompt_scale_shift_table[None, None].to(device=h.device, dtype=h.dtype)
        shift_kv, scale_kv = table.unbind(dim=2)
        x = x * (1 + scale_q) + shift_q
        return self.attn2(x, text * (1 + scale_kv) + shift_kv, cond.text_mask) * gate_q


class LTX2Transformer(VideoTransformer):
    """LTX-2's transformer, the video path, from the family's `model` section."""

    input_layers = ("proj_in",)
    output_layers = ("scale_shift_table", "proj_out")
    token_levels = True  # image-to-video gives the first frame's tokens their own level, as the pipeline

    def __init__(self, config: LTX2Model) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden
        self.proj_in = nn.Linear(config.in_channels, hidden)
        if config.caption_projection:
            self.caption_projection = PixArtTextProjection(config.text_dim, hidden)
        rows = MODULATION + (PROMPT_MODULATION if config.prompt_modulation else 0)
        self.time_embed = AdaLayerNormSingle(hidden, rows)
        if config.prompt_modulation and config.prompt_modulation_per_step:
            self.prompt_adaln = AdaLayerNormSingle(hidden, 2)
        self.transformer_blocks = nn.ModuleDict({str(i): Block(config) for i in range(config.layers)})
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden) / hidden**0.5)
        self.proj_out = nn.Linear(hidden, config.in_channels)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """A fresh model as diffusers initialises one: PyTorch's defaults for Linear (fan-in uniform) and
        the q/k RMSNorms (ones), the modulation tables N(0, 1/hidden), the prompt modulation's table N(0, 1).
        Only for training from scratch; a fine-tune loads the published weights over it. Callable again
        after building on the meta device and materialising with `to_empty`."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.RMSNorm):
                module.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("prompt_scale_shift_table"):
                nn.init.normal_(p)
            elif name.endswith("scale_shift_table"):
                nn.init.normal_(p, std=self.config.hidden**-0.5)

    @property
    def blocks(self) -> nn.ModuleDict:  # the shared forward's name for the stack; diffusers' is kept
        return self.transformer_blocks

    @property
    def param_dtype(self) -> torch.dtype:
        return self.proj_in.weight.dtype

    def forward(self, x: torch.Tensor, noise_level: torch.Tensor, text: torch.Tensor, *args, **kwargs):
        """`VideoTransformer.forward` over plain batches (a context-parallel rank's share of one too: RoPE
        reads the shard's global positions)."""
        shard = kwargs.get("shard")
        if kwargs.get("layout") is not None or (shard is not None and shard.packed):
            raise UserInputError("model.family=ltx2 runs plain batches only so far: set data.packing=false")
        return super().forward(x, noise_level, text, *args, **kwargs)

    def conditioning(
        self,
        place: TokenPlacement,
        noise_level: torch.Tensor,
        text: torch.Tensor,
        text_mask: torch.Tensor | None,
        drop_text: torch.Tensor | None,
    ) -> LTX2Conditioning:
        """`time`: the embedded timestep the output layer reads, (N, hidden) or per token (rows, S, hidden);
        `shared_modulation`: its 6 (9) x hidden projection every block adds its table to; `text`: the
        (projected) caption; `prompt_time`: the per-step prompt modulation's term."""
        if drop_text is not None and bool(drop_text.any()):  # the trainer passes all-False without dropout
            raise UserInputError(
                "diffusion.caption_dropout: LTX-2 trains with its encoded empty prompt, not a dropped caption "
                "(not built yet); set diffusion.caption_dropout=0"
            )
        sinusoids = timestep_sinusoids((noise_level * TIMESTEP_SCALE).flatten())
        temb, embedded = self.time_embed(sinusoids, self.param_dtype)
        if noise_level.ndim == 2:  # per token
            temb, embedded = temb.view(*noise_level.shape, -1), embedded.view(*noise_level.shape, -1)
        prompt_time = None
        if hasattr(self, "prompt_adaln"):
            sigma = noise_level if noise_level.ndim == 1 else noise_level.amax(dim=1)
            prompt_time, _ = self.prompt_adaln(timestep_sinusoids(sigma * TIMESTEP_SCALE), self.param_dtype)
            prompt_time = prompt_time[:, None]
        keys = KeyPadding(text_mask) if text_mask is not None else None
        rope = rope_tables(place.positions, self.config)
        caption = self.caption_projection(text) if self.config.caption_projection else text
        return LTX2Conditioning(
            embedded,
            temb,
            caption,
            keys,
            rope,
            place.scopes,
            place.token_sample,
            place.positions,
            prompt_time=prompt_time,
        )

    def embed(self, tokens: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        return self.proj_in(tokens)

    def head(self, h: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """norm_out (LayerNorm without affine) modulated by the table plus the embedded timestep, proj_out."""
        values = self.scale_shift_table[None, None] + cond.per_token(cond.time)[:, :, None]
        shift, scale = values[:, :, 0], values[:, :, 1]
        out = F.layer_norm(h, (h.shape[-1],), eps=OUT_EPS) * (1 + scale) + shift
        return self.proj_out(out)
