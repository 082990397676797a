"""HunyuanVideo-1.5's caption encoder as its pipelines run it (diffusers' `HunyuanVideo15Pipeline.encode_prompt`),
behind vidforge's text-encoder interface: the caption is Qwen2.5-VL's text model read through a chat
template with the pipeline's system message (its third-last hidden states, the template's first tokens
cropped off), then Glyph-ByT5's states of the quoted text in the caption (zeros and an empty mask when it
quotes nothing), the two joined by `captions.join_caption`. Both encoders and tokenizers come from a
published folder (`published.read_pipeline`'s text_encoder/, tokenizer/, text_encoder_2/, tokenizer_2/)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from vidforge.device import select_device
from vidforge.errors import UserInputError
from vidforge.families.hunyuan15.captions import join_caption
from vidforge.families.hunyuan15.published import MLLM_TOKENS, read_pipeline
from vidforge.profile import RunProfile
from vidforge.text.encoders import TextEncoderBase

# The pipeline's system message, byte for byte (its source continues the string over lines with a
# backslash, so each numbered aspect follows eight spaces).
SYSTEM_MESSAGE = (
    "You are a helpful assistant. Describe the video by detailing the following aspects:         "
    "1. The main content and theme of the video.         "
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.         "
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.         "
    "4. background environment, light, style and atmosphere.         "
    "5. camera angles, movements, and transitions used in the video."
)
SKIPPED_LAYERS = 2  # the MLLM's states are those of its third-last layer (num_hidden_layers_to_skip)
GLYPH_QUOTES = re.compile(r"\"(.*?)\"|“(.*?)”")  # text in straight or curly double quotes


def glyph_text(caption: str) -> str | None:
    """The ByT5 input of a caption: its quoted texts (each once when there are several), as
    `Text "a". Text "b". `; None when it quotes nothing."""
    found = [a or b for a, b in GLYPH_QUOTES.findall(caption)]
    if len(found) > 1:
        found = list(dict.fromkeys(found))
    return ". ".join(f'Text "{text}"' for text in found) + ". " if found else None


class HunyuanVideo15TextEncoder(TextEncoderBase):
    """Captions -> (B, mllm_tokens + glyph_tokens, mllm width): the MLLM's cropped states, then the glyph
    encoder's zero-padded to that width (`join_caption`), with one mask."""

    def __init__(
        self,
        folder: str,
        mllm_tokens: int,
        glyph_tokens: int,
        device: str = "auto",
        batch_size: int = 32,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(batch_size)
        pipeline = read_pipeline(Path(folder))
        if pipeline is None or pipeline.mllm is None or pipeline.glyph is None:
            raise UserInputError(
                f"text_encoder.path: {folder} is no HunyuanVideo-1.5 pipeline folder with text_encoder/, "
                "tokenizer/, text_encoder_2/ and tokenizer_2/; point it at the published download"
            )
        from transformers import AutoTokenizer, ByT5Tokenizer, Qwen2_5_VLTextModel, T5EncoderModel

        self.device = select_device(device, "text_encoder.device")
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.path, self.crop = str(folder), pipeline.mllm_crop
        self.mllm_tokens, self.glyph_tokens = mllm_tokens, glyph_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(pipeline.mllm.preprocessor or pipeline.mllm.path)
        self.mllm = (
            Qwen2_5_VLTextModel.from_pretrained(pipeline.mllm.path, dtype=dtype).eval().to(self.device)
        )
        self.glyph_tokenizer = ByT5Tokenizer.from_pretrained(
            pipeline.glyph.preprocessor or pipeline.glyph.path
        )
        self.glyph = T5EncoderModel.from_pretrained(pipeline.glyph.path, dtype=dtype).eval().to(self.device)
        self.max_length = mllm_tokens + glyph_tokens
        self.width = self.mllm.config.hidden_size
        if self.glyph.config.d_model > self.width:
            raise UserInputError(
                f"text_encoder.path: the glyph encoder ({self.glyph.config.d_model} wide) must fit the MLLM's "
                f"{self.width} features; use a published HunyuanVideo-1.5 folder"
            )

    def mllm_states(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The MLLM's (B, mllm_tokens, width) states and mask, as `_get_mllm_prompt_embeds`."""
        chats = [
            [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": c or " "}]
            for c in captions
        ]
        enc = self.tokenizer.apply_chat_template(
            chats,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            padding="max_length",
            max_length=self.mllm_tokens + self.crop,
            truncation=True,
            return_tensors="pt",
        )
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        states = self.mllm(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        return states[-(SKIPPED_LAYERS + 1)][:, self.crop :], mask[:, self.crop :].bool()

    def glyph_states(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """ByT5's (B, glyph_tokens, its width) states and mask, one caption at a time as
        `_get_byt5_prompt_embeds`."""
        states, masks = [], []
        for caption in captions:
            text = glyph_text(caption)
            if text is None:
                states.append(
                    torch.zeros(1, self.glyph_tokens, self.glyph.config.d_model, dtype=self.glyph.dtype)
                )
                masks.append(torch.zeros(1, self.glyph_tokens, dtype=torch.bool))
                continue
            enc = self.glyph_tokenizer(
                text, padding="max_length", max_length=self.glyph_tokens, truncation=True, return_tensors="pt"
            )
            ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
            states.append(self.glyph(input_ids=ids, attention_mask=mask.float())[0].cpu())
            masks.append(mask.bool().cpu())
        return torch.cat(states).to(self.device), torch.cat(masks).to(self.device)

    def _encode_batch(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return join_caption(*self.mllm_states(captions), *self.glyph_states(captions))

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "family",
            "family": "hunyuan15",
            "path": self.path,
            "width": self.width,
            "max_length": self.max_length,
            "note": f"HunyuanVideo-1.5's Qwen2.5-VL text model and Glyph-ByT5 from {self.path}",
        }


def build(profile: RunProfile) -> HunyuanVideo15TextEncoder:
    """The profile's caption encoder: `text_encoder.path` the published folder; `text_encoder.max_length`
    the MLLM's tokens plus the glyph encoder's (`model.text_2_tokens`)."""
    cfg, glyphs = profile.text_encoder, profile.model.text_2_tokens
    if cfg.path is None:
        raise UserInputError(
            "text_encoder.path: the hunyuan15 caption encoder reads a published HunyuanVideo-1.5 folder; "
            "set --set text_encoder.path=DIR"
        )
    if cfg.max_length <= glyphs:
        raise UserInputError(
            f"text_encoder.max_length: {cfg.max_length} leaves no MLLM tokens beside the glyph encoder's "
            f"{glyphs} (model.text_2_tokens); the pipeline's is {MLLM_TOKENS + glyphs}"
        )
    return HunyuanVideo15TextEncoder(
        str(cfg.path), cfg.max_length - glyphs, glyphs, cfg.device, cfg.batch_size
    )
