"""LTX-2's caption encoder as its pipeline runs it (diffusers' `LTX2Pipeline.encode_prompt`, then its
`connectors`), behind vidforge's text-encoder interface: the caption, stripped, left-padded to the
pipeline's 1024 Gemma tokens; Gemma 3's hidden states of every layer (the embeddings' included) stacked
per token; the text connector (diffusers' `LTX2TextConnectors`, loaded from the folder) turns them into
the transformer's caption, its video output with its mask (all true where the connector fills the padding
with learned registers). The audio output is not kept: the video path does not read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vidforge.device import select_device
from vidforge.errors import UserInputError
from vidforge.families.ltx2.published import read_pipeline
from vidforge.profile import RunProfile
from vidforge.text.encoders import TextEncoderBase

PADDING_SIDE = "left"  # Gemma's, as the pipeline sets it (the connector's normalisation reads it too)


class LTX2TextEncoder(TextEncoderBase):
    """Captions -> (B, caption_tokens, connector width) video captions and their (B, caption_tokens) mask."""

    def __init__(
        self,
        folder: str,
        max_length: int,
        device: str = "auto",
        batch_size: int = 32,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(batch_size)
        pipeline = read_pipeline(Path(folder))
        if pipeline is None or None in (pipeline.text_encoder, pipeline.tokenizer, pipeline.connectors):
            raise UserInputError(
                f"text_encoder.path: {folder} is no LTX-2 pipeline folder with text_encoder/, tokenizer/ and "
                "connectors/; point it at the published download"
            )
        from diffusers.pipelines.ltx2 import LTX2TextConnectors
        from transformers import AutoTokenizer, Gemma3ForConditionalGeneration

        self.device = select_device(device, "text_encoder.device")
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.path, self.max_length = str(folder), max_length
        self.tokenizer = AutoTokenizer.from_pretrained(pipeline.tokenizer)
        self.tokenizer.padding_side = PADDING_SIDE
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.gemma = (
            Gemma3ForConditionalGeneration.from_pretrained(pipeline.text_encoder, dtype=dtype)
            .eval()
            .to(self.device)
        )
        # the connector runs in the dtype the pipeline hands it: the text encoder's
        self.connectors = LTX2TextConnectors.from_pretrained(pipeline.connectors, torch_dtype=dtype)
        self.connectors = self.connectors.eval().to(self.device)
        config = self.connectors.config
        self.width = config.video_hidden_dim if config.per_modality_projections else config.caption_channels

    def gemma_states(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every Gemma layer's states stacked per token (B, L, width x (layers + 1)) and the token mask, as
        `_get_gemma_prompt_embeds`."""
        enc = self.tokenizer(
            [c.strip() for c in captions],
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        ids, mask = enc.input_ids.to(self.device), enc.attention_mask.to(self.device)
        states = self.gemma(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        return torch.stack(states, dim=-1).flatten(2, 3), mask

    def _encode_batch(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        states, mask = self.gemma_states(captions)
        video, _, video_mask = self.connectors(states, mask, padding_side=PADDING_SIDE)
        return video, video_mask.bool()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "family",
            "family": "ltx2",
            "path": self.path,
            "width": self.width,
            "max_length": self.max_length,
            "note": f"LTX-2's Gemma 3 and text connector from {self.path}",
        }


def build(profile: RunProfile) -> LTX2TextEncoder:
    """The profile's caption encoder: `text_encoder.path` the published folder, `text_encoder.max_length`
    Gemma's tokens per caption (the pipeline's 1024)."""
    cfg = profile.text_encoder
    if cfg.path is None:
        raise UserInputError(
            "text_encoder.path: the ltx2 caption encoder reads a published LTX-2 folder (Gemma 3 and its "
            "text connector); set --set text_encoder.path=DIR"
        )
    return LTX2TextEncoder(str(cfg.path), cfg.max_length, cfg.device, cfg.batch_size)
