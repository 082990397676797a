"""Text encoders: per-token hidden states and a mask for the DiT's cross-attention."""

from vidforge.text.encoders import OpenClipTextEncoder, T5TextEncoder, TextEncoderBase, build_text_encoder

__all__ = ["OpenClipTextEncoder", "T5TextEncoder", "TextEncoderBase", "build_text_encoder"]
