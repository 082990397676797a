"""Video tokenizers: latents for the DiT. A weight-free pixel tokenizer and diffusers' causal 3D VAEs."""

from vidforge.tokenizers.base import build_tokenizer
from vidforge.tokenizers.interface import VideoTokenizer, frames_to_tensor, tensor_to_frames
from vidforge.tokenizers.pixel import PixelTokenizer

__all__ = ["PixelTokenizer", "VideoTokenizer", "build_tokenizer", "frames_to_tensor", "tensor_to_frames"]
