"""The layers DiT and ST-DiT blocks are made of. Every matrix is a plain `nn.Linear` with a stable
name, so tensor parallel can be declared from outside: q/k/v and fc1/fc3 column-wise, out and fc2
row-wise. Tokens are (B, S, hidden); a packed row has B = 1.

Attention layers take their head count from the projections' output width (`unflatten(-1, (-1,
head_dim))`), not from `heads`: under tensor parallel a rank's q/k/v hold only its heads, and the same
code runs unchanged. QK RMSNorm normalises each head on its own, so it needs nothing from other ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn

from vidforge.attention.dispatch import Attend, AttentionMask
from vidforge.attention.video_sparse import select_tiles
from vidforge.errors import UserInputError
from vidforge.models.rope import apply_rope
from vidforge.models.scopes import Scope, tile_scope


@dataclass(eq=False)
class Conditioning:
    """Everything a block reads besides its tokens, computed once per forward by `DiT.condition` (and
    recomputed on each pipeline stage rather than sent along).

    time: (N, hidden) timestep embedding, one row per sample (N = B, or the packed sample count); or
        (rows, S, hidden), one per token, from a per-token noise level (`VideoTransformer.token_levels`).
    shared_modulation: (N, chunks*hidden) AdaLN-LoRA's shared term, or None without AdaLN-LoRA (per token
        like `time` where that is).
    text: projected caption tokens: (B, L, hidden), or (1, sum of valid L_i, hidden) when packed.
    text_mask: the cross-attention mask: KeyPadding, Segments (packed) or None.
    rope: cos and sin tables, each (S, head_dim/2).
    scopes: the attention scopes by name ("full", "spatial", "temporal").
    token_sample: (S,) sample index of every token when packed; None for a plain batch.
    positions: (S, 3) integer (t, h, w) position of every token in its sample.
    image: projected image-embedding tokens cross-attention also reads (image-to-video families), laid out
        like `text`; None without an image.
    image_mask: their cross-attention mask, as `text_mask`.
    """

    time: torch.Tensor
    shared_modulation: torch.Tensor | None
    text: torch.Tensor
    text_mask: AttentionMask
    rope: tuple[torch.Tensor, torch.Tensor]
    scopes: dict[str, Scope] = field(default_factory=dict)
    token_sample: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    image: torch.Tensor | None = None
    image_mask: AttentionMask = None

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        """Per-sample rows (N, F) broadcast against tokens: (B, 1, F); when packed, (1, S, F) (S the
        length of `token_sample`, which is a rank's slice of the row under sequence parallel), or (1, 1, F)
        when the row holds one sample. That case is a broadcast, not a gather: a gathered (S, 6 x hidden)
        float32 table per block is written in the forward, saved by every product with it, and
        accumulated back onto one row in the backward (at 32K tokens and hidden 1536, 1.2 GB a block)."""
        if values.ndim == 3:  # already per token (rows, S, F): a per-token noise level's
            return values
        if self.token_sample is None:
            return values.unsqueeze(1)
        if values.shape[0] == 1:
            return values.unsqueeze(0)
        return values[self.token_sample].unsqueeze(0)

    def token_slice(self, start: int, end: int) -> Conditioning:
        """The conditioning of tokens [start, end) of the row, for blocks whose residual stream holds only
        those tokens (sequence parallel). Only `token_sample` is per token in what blocks read between
        attentions; rope, positions and scopes stay whole because attention runs on the whole row (the
        sequence is gathered before the q/k/v projections). A plain batch's per-sample rows broadcast
        against any slice, so it returns itself; per-token rows (`time` (rows, S, hidden)) are sliced."""
        if self.time.ndim == 3:
            shared = self.shared_modulation
            return replace(
                self,
                time=self.time[:, start:end],
                shared_modulation=shared[:, start:end] if shared is not None else None,
                token_sample=self.token_sample[start:end] if self.token_sample is not None else None,
            )
        if self.token_sample is None:
            return self
        return replace(self, token_sample=self.token_sample[start:end])


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedding(nn.Module):
    """Noise level -> (N, hidden): sinusoidal features, then Linear-SiLU-Linear (DiT). The EDM noise
    input c_noise = ln(sigma)/4 spans about [-1.6, 1.1]; it is multiplied by `scale` so that the
    sinusoids' periods (1 to 10^4) resolve that range."""

    def __init__(self, hidden: int, frequencies: int = 256, scale: float = 1000.0) -> None:
        super().__init__()
        self.frequencies = frequencies
        self.scale = scale
        self.fc1 = nn.Linear(frequencies, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def sinusoids(self, noise_level: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        freqs = torch.exp(
            -math.log(10000.0) * torch.arange(half, device=noise_level.device, dtype=torch.float32) / half
        )
        angle = noise_level.float()[:, None] * self.scale * freqs[None]
        return torch.cat([angle.cos(), angle.sin()], dim=-1)

    def forward(self, noise_level: torch.Tensor) -> torch.Tensor:
        features = self.sinusoids(noise_level).to(self.fc1.weight.dtype)
        return self.fc2(F.silu(self.fc1(features)))


class TextProjection(nn.Module):
    """Text encoder states (.., text_dim) -> (.., hidden): Linear-GELU(tanh)-Linear (Wan, PixArt)."""

    def __init__(self, text_dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(text_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(text), approximate="tanh"))


class TimestepMLP(nn.Module):
    """diffusers' TimestepEmbedding with its parameter names (linear_1, SiLU, linear_2): the published
    families' timestep MLP, so their weights load by name."""

    def __init__(self, inputs: int, hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(inputs, hidden)
        self.linear_2 = nn.Linear(hidden, hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(features)))


class PixArtTextProjection(nn.Module):
    """diffusers' PixArtAlphaTextProjection with its parameter names (linear_1, GELU tanh, linear_2): the
    published families' caption projection (TextProjection above is the vidforge DiT's, fc1/fc2)."""

    def __init__(self, text_dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(text_dim, hidden)
        self.linear_2 = nn.Linear(hidden, hidden)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(text), approximate="tanh"))


class Modulation(nn.Module):
    """Adaptive LayerNorm parameters (shift, scale, gate per sub-layer) from the timestep embedding.

    Full (rank 0): one Linear(hidden, chunks*hidden) per block. AdaLN-LoRA (rank r): a rank-r product
    up(down(.)) per block added to one shared full projection computed by the model (NeMo; Gupta et al.
    2023), cutting the per-block modulation parameters from chunks*hidden^2 to r*(chunks+1)*hidden.
    The output projection starts at zero, so every block starts as the identity (DiT's adaLN-Zero)."""

    def __init__(self, hidden: int, chunks: int, lora_rank: int = 0) -> None:
        super().__init__()
        self.chunks = chunks
        self.lora_rank = lora_rank
        if lora_rank:
            self.down = nn.Linear(hidden, lora_rank, bias=False)
            self.up = nn.Linear(lora_rank, chunks * hidden, bias=False)
        else:
            self.proj = nn.Linear(hidden, chunks * hidden)
        self.zero_init()

    def zero_init(self) -> None:
        """Zero the output projection (called again by `DiT.init_weights` after its generic init)."""
        out = self.up if self.lora_rank else self.proj
        nn.init.zeros_(out.weight)
        if out.bias is not None:
            nn.init.zeros_(out.bias)

    def params(self, cond: Conditioning) -> torch.Tensor:
        """Per-sample rows (N, chunks*hidden), before broadcasting against tokens."""
        act = F.silu(cond.time)
        if self.lora_rank:
            if cond.shared_modulation is None:
                raise ValueError("AdaLN-LoRA blocks need the model's shared modulation in Conditioning")
            return self.up(self.down(act)) + cond.shared_modulation
        return self.proj(act)

    def forward(self, cond: Conditioning) -> tuple[torch.Tensor, ...]:
        return cond.per_token(self.params(cond)).chunk(self.chunks, dim=-1)


class _HeadProjections(nn.Module):
    """The q, k, v and out projections of multi-head attention, with per-head QK RMSNorm: what self- and
    cross-attention share (the parameter names are the checkpoints' and the tensor-parallel plans')."""

    def __init__(self, hidden: int, heads: int, qk_norm: bool = True, attend: Attend | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else nn.Identity()
        self.attend = attend or Attend()

    def heads_qkv(self, x: torch.Tensor, context: torch.Tensor):
        """q from x, k and v from context, as (B, S, heads, head_dim), q and k normalised."""
        q = self.q_norm(self.q(x).unflatten(-1, (-1, self.head_dim)))
        k = self.k_norm(self.k(context).unflatten(-1, (-1, self.head_dim)))
        return q, k, self.v(context).unflatten(-1, (-1, self.head_dim))


class SelfAttention(_HeadProjections):
    """Multi-head self-attention with per-head QK RMSNorm and 3D RoPE; the `scope` decides whether it
    is full, spatial or temporal attention."""

    def __init__(self, hidden: int, heads: int, qk_norm: bool = True, attend: Attend | None = None) -> None:
        super().__init__(hidden, heads, qk_norm, attend)
        self.tiles: tuple[tuple[int, int, int], tuple[int, int, int] | None] | None = None  # (tile, window)
        self.topk: int | None = None  # video sparse attention's key tiles per query tile (window None)

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """q, k, v as (B, S, heads, head_dim) (this rank's heads under tensor parallel), normalised and rotated; what `attend` receives before the
        scope regroups them (exposed so tests can compute the attention independently)."""
        q, k, v = self.heads_qkv(x, x)
        cos, sin = rope
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], scope: Scope) -> torch.Tensor:
        q, k, v = self.project(x, rope)
        if self.tiles is not None:
            scope = tile_scope(scope, *self.tiles, x.device)
        q, k, v = scope.gather(q), scope.gather(k), scope.gather(v)
        mask = scope.mask if self.topk is None else select_tiles(scope.mask, q, k, self.topk)
        return self.out(scope.scatter(self.attend(q, k, v, mask)).flatten(-2))


class CrossAttention(_HeadProjections):
    """Tokens attend to the (projected) caption tokens of their own sample. No RoPE on text."""

    def forward(self, x: torch.Tensor, text: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        q, k, v = self.heads_qkv(x, text)
        return self.out(self.attend(q, k, v, mask).flatten(-2))


class MLP(nn.Module):
    """GELU-tanh: fc2(gelu(fc1 x)). SwiGLU: fc2(silu(fc1 x) * fc3 x) (fc1 the gate, fc3 the up
    projection, as in LLaMA's w1/w3)."""

    def __init__(self, hidden: int, inner: int, activation: str = "gelu-tanh") -> None:
        super().__init__()
        if activation not in ("gelu-tanh", "swiglu"):
            raise UserInputError(f"model.mlp_act: unknown {activation!r}; use gelu-tanh or swiglu")
        self.activation = activation
        self.fc1 = nn.Linear(hidden, inner)
        self.fc2 = nn.Linear(inner, hidden)
        self.fc3 = nn.Linear(hidden, inner) if activation == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc3 is not None:
            return self.fc2(F.silu(self.fc1(x)) * self.fc3(x))
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class FinalLayer(nn.Module):
    """Adaptive LayerNorm (shift, scale) and a projection back to patch features; both zero-initialised
    so the network's output starts at zero (DiT)."""

    def __init__(self, hidden: int, patch_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.modulation = nn.Linear(hidden, 2 * hidden)
        self.proj = nn.Linear(hidden, patch_dim)
        self.zero_init()

    def zero_init(self) -> None:
        for layer in (self.modulation, self.proj):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        shift, scale = cond.per_token(self.modulation(F.silu(cond.time))).chunk(2, dim=-1)
        return self.proj(modulate(self.norm(x), shift, scale))
