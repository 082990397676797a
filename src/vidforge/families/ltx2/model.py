"""The ltx2 family's model section: LTX-2's shape as the profile holds it, and its published preset
(torch-free: the profile's validator reads them). Field names are vidforge's where the DiT has the same
quantity (layers, hidden, heads, mlp_hidden, patch, in_channels, text_dim), so the shared forward
(`VideoTransformer`) reads them as it reads any family's; the rest are this family's own, each the diffusers
`LTX2VideoTransformer3DModel` config entry it mirrors.

The video path only: the published network is joint audio-video, and its video stream reads the audio
stream only through the audio-to-video cross-attention; with that off (diffusers' `isolate_modalities=True`,
LTX-core's video-only model) the video output depends on the video latents, the caption and the time
alone, which is what this family computes (`audio` refuses True in one line). The caption is the text
connector's video output (`LTX2TextConnectors`' first result, caption_channels wide)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from vidforge.families.model import FixedBlock, Model, NoImageInputs

FAMILY = "ltx2"
LATENT_CHANNELS = 128  # AutoencoderKLLTX2Video's latent channels (the transformer's in/out_channels)
FF_MULT = 4  # diffusers' FeedForward in every block: gelu-approximate, 4x the width (no config entry)

# What the network refuses at its first forward, stated as settings every profile of the family carries
# (its presets' `profile_defaults` and a published folder's defaults), so that the rulebook's refusal at
# load (`layout_rules`) never meets a profile the family gave: packed rows (plain
# batches only so far), and caption dropout (LTX-2 trains the unconditional branch on its encoded empty
# prompt, which is not built).
PLAIN_BATCHES = {"data.packing": False, "diffusion.caption_dropout": 0}


class LTX2Model(Model, FixedBlock, NoImageInputs):
    """LTX2VideoTransformer3DModel's video path in vidforge's words (diffusers' entry in brackets); the
    defaults are diffusers' config defaults (what a config.json without the entry means)."""

    # The cross-attention reads an RMS norm of the stream without weights (no learned float32 norm, which is
    # what cross_attn_norm costs in Wan's block).
    cross_attn_norm: ClassVar[bool] = False
    # Image-to-video is the same network with the first latent frame clean, its tokens at timestep 0
    # (LTX2ImageToVideoPipeline; Lightricks' trainer's first-frame conditioning): every LTX-2 model samples
    # from an image given one (`infer --image`) and trains it with `diffusion.image_condition`.
    expand_timesteps: ClassVar[bool] = True

    family: Literal["ltx2"] = FAMILY
    """LTX-2 / LTX-2.3 (Lightricks), the video path; `vidforge model import` brings its published weights in."""
    preset: str | None = None
    layers: int = Field(48, ge=1)
    """Transformer blocks (num_layers)."""
    hidden: int = Field(4096, ge=1)
    """Video width (num_attention_heads x attention_head_dim)."""
    heads: int = Field(32, ge=1)
    """Video attention heads (num_attention_heads)."""
    mlp_hidden: int = Field(FF_MULT * 4096, ge=1)
    """Inner width of the feed-forwards: 4 x hidden, as diffusers' FeedForward builds it (filled in when not
    given; another value is refused)."""
    patch: tuple[int, int, int] = (1, 1, 1)
    """(patch_size_t, patch_size, patch_size): the published 1x1x1 only (the VAE compresses 8x32x32)."""
    in_channels: int = Field(LATENT_CHANNELS, ge=1)
    """Latent channels read and predicted (in_channels = out_channels)."""
    text_dim: int = Field(3840, ge=1)
    """The text connector's output width (caption_channels)."""
    rope_theta: float = Field(10000.0, gt=0)
    """Base of the rotary position embedding's frequencies (rope_theta)."""
    rope_type: Literal["interleaved", "split"] = "interleaved"
    """How q and k channels pair up for RoPE (rope_type)."""
    rope_double_precision: bool = True
    """RoPE's frequency ladder computed in float64 before float32 (rope_double_precision)."""
    rope_base: tuple[float, float, float] = (20.0, 2048.0, 2048.0)
    """(pos_embed_max_pos, base_height, base_width): the pixel-space (seconds, pixels, pixels) extents
    positions are divided by."""
    vae_scale: tuple[int, int, int] = (8, 32, 32)
    """The VAE's (t, h, w) compression that maps latent positions to pixel positions (vae_scale_factors)."""
    causal_offset: int = Field(1, ge=0)
    """The causal VAE's first latent frame covers this many pixel frames (causal_offset)."""
    frame_rate: float = Field(24.0, gt=0)
    """Frame rate RoPE's time axis assumes, in frames a second (the pipeline's frame_rate; infer.fps and
    curation.fps follow it)."""
    gated_attention: bool = False
    """Per-head gates 2 sigmoid(Linear(x)) on the attentions' outputs (gated_attn; LTX-2.3)."""
    prompt_modulation: bool = False
    """The caption cross-attention modulated: its query by three more rows of each block's table, the
    caption by `prompt_scale_shift_table` (cross_attn_mod; LTX-2.3)."""
    prompt_modulation_per_step: bool = True
    """With `prompt_modulation`, the caption's modulation also follows the noise level (`prompt_adaln`);
    False: the table alone (use_prompt_adaln_single)."""
    caption_projection: bool = True
    """The caption goes through `caption_projection`; False: the connector already projects it to the
    width (use_prompt_embeddings; LTX-2.3)."""
    ff_bias: bool = True
    """The feed-forwards' biases (ff_bias)."""
    eps: float = Field(1e-6, gt=0)
    """The blocks' RMSNorm and q/k RMSNorm epsilon (norm_eps)."""
    perturbed_attention: bool = False
    """The self-attentions take spatio-temporal guidance's perturbation (perturbed_attn; LTX-2.3), which the
    pipeline samples with by default (STG, at block 28): not built, so `vidforge infer` refuses such a
    model; set false to sample without it. Training is unaffected (the perturbation is sampling's)."""
    audio: bool = False
    """The audio stream: not built (see the module's docstring); refused when set."""

    @model_validator(mode="before")
    @classmethod
    def _fill_mlp_hidden(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mlp_hidden" not in data and isinstance(data.get("hidden"), int):
            return {**data, "mlp_hidden": FF_MULT * data["hidden"]}
        return data

    @model_validator(mode="after")
    def _check_ltx2(self) -> LTX2Model:
        if self.audio:
            raise ValueError(
                "audio: LTX-2's audio stream is not built yet (the video path runs with the audio "
                "cross-attention off); set it to false"
            )
        if self.patch != (1, 1, 1):
            raise ValueError(
                f"patch: LTX-2 is built for its published patch (1, 1, 1), got {list(self.patch)}"
            )
        if self.mlp_hidden != FF_MULT * self.hidden:
            raise ValueError(
                f"mlp_hidden: LTX-2's feed-forward is {FF_MULT} x hidden = {FF_MULT * self.hidden}, got "
                f"{self.mlp_hidden}; drop mlp_hidden"
            )
        if not self.caption_projection and self.text_dim != self.hidden:
            raise ValueError(
                f"text_dim: without caption_projection the caption is read at the width {self.hidden}, "
                f"got {self.text_dim}"
            )
        if self.attention_window is not None or self.attention_topk is not None:
            raise ValueError(
                "attention_window: sliding-tile and video sparse attention are not built for the ltx2 "
                "family; drop attention_window and attention_topk"
            )
        if self.experts != 1:
            raise ValueError(f"experts: LTX-2 is one network, got {self.experts}; drop experts")
        return self


# The published LTX-2 transformer (Lightricks/LTX-2, transformer/ of its diffusers layout, the shape of
# diffusers' scripts/convert_ltx2_to_diffusers.py for version 2.0): its video stream, 48 blocks of 32 heads
# of 128 over the VAE's 128 channels, a 3840-wide caption (Gemma 3 12B through the connector), split RoPE.
# LTX-2.3's variants (gated attention, prompt modulation, unprojected caption) come in by `vidforge model
# import` of its folder, which states them.
PRESETS: dict[str, dict[str, object]] = {
    "ltx-2": {
        "layers": 48, "hidden": 4096, "heads": 32, "patch": (1, 1, 1),
        "in_channels": LATENT_CHANNELS, "text_dim": 3840, "rope_type": "split",
    },
}  # fmt: skip
