"""Caption encoders. Each returns per-token hidden states (B, L, D) and a bool mask (B, L): float16 for
the shards (`encode`: half the bytes of a caption store), float32 for sampling (`encode_to_sample`: the
encoder's own float32 or bfloat16 states exactly, as the diffusers pipelines hand them to the transformer).
The hidden states at padding positions are zeroed so nothing past a caption leaks into cross-attention.

- `OpenClipTextEncoder`: an open-clip model's text tower (77-token context), from a local checkpoint, or
  a small random tower when none is given (demo and tests; the embeddings then mean nothing).
- `T5TextEncoder`: a T5 or umT5 encoder (and its tokenizer) from a local `transformers` folder; what real
  runs use, since captions of 100-200 tokens overflow CLIP's context. Wan2.1 reads umT5-XXL states of
  512 tokens (its pipeline folder's text_encoder/ and tokenizer/; `max_length` 512).
- a family's own encoder (`text_encoder.kind=family`), which its `FamilySpec.text_encoder` names: one
  whose pipeline encodes a caption some other way (HunyuanVideo-1.5's two encoders in one caption)."""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidforge.device import select_device
from vidforge.errors import UserInputError
from vidforge.families import family, load
from vidforge.profile import RunProfile


class TextEncoderBase(ABC):
    """Common shape of the encoders: `encode(captions) -> (hidden float16 (B, L, D), mask bool (B, L))`,
    `encode_to_sample(captions)`: the same as float32 tensors."""

    width: int
    max_length: int

    def __init__(self, batch_size: int = 32):
        self.batch_size = batch_size

    @abstractmethod
    def _encode_batch(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states (B, L, D) and mask (B, L) of one batch of captions."""

    @torch.inference_mode()
    def encode(self, captions: list[str], dtype: type = np.float16) -> tuple[np.ndarray, np.ndarray]:
        """(hidden (B, L, D) as `dtype`, mask (B, L)); float16 is what shards store."""
        hidden_parts, mask_parts = [], []
        for start in range(0, len(captions), self.batch_size):
            hidden, mask = self._encode_batch([c or "" for c in captions[start : start + self.batch_size]])
            hidden = hidden.float() * mask[..., None]
            hidden_parts.append(hidden.cpu().numpy().astype(dtype, copy=False))
            mask_parts.append(mask.bool().cpu().numpy())
        if not hidden_parts:
            return np.zeros((0, self.max_length, self.width), dtype), np.zeros((0, self.max_length), bool)
        return np.concatenate(hidden_parts), np.concatenate(mask_parts)

    def encode_to_sample(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """What a sampler reads: (hidden float32 (B, L, D), mask bool (B, L)), not rounded to float16 as
        training's stored captions are, so infer equals the pipeline that runs the same encoder."""
        hidden, mask = self.encode(captions, np.float32)
        return torch.from_numpy(hidden), torch.from_numpy(mask)

    random_weights = False
    """True for a tower built without a checkpoint (demos, tests): its embeddings carry no meaning."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the shards' index records about the encoder."""


class OpenClipTextEncoder(TextEncoderBase):
    """An open-clip text tower's final-layer token states (after ln_final, before the pooled projection)."""

    def __init__(
        self,
        arch: str = "ViT-B-32",
        path: str | None = None,
        max_length: int = 77,
        random_width: int = 32,
        random_layers: int = 2,
        seed: int = 0,
        device: str = "auto",
        batch_size: int = 32,
    ):
        super().__init__(batch_size)
        import open_clip

        self.device = select_device(device, "text_encoder.device")
        self.arch, self.path = arch, path
        self.random_weights = path is None
        if path is not None:
            if not Path(path).is_file():
                raise UserInputError(f"text_encoder.path: open-clip checkpoint not found: {path}")
            if arch.endswith(".json"):  # a custom architecture given as an open-clip model config file
                open_clip.add_model_config(arch)
                arch = Path(arch).stem
            model = open_clip.create_model(arch, pretrained=path, device="cpu")
            self.tower = getattr(model, "text", model)  # CustomTextCLIP keeps the tower in .text
            context = self.tower.positional_embedding.shape[0]
            self.note = f"open-clip {arch} text tower from {path}"
        else:
            from open_clip.transformer import TextTransformer

            heads = next(h for h in (8, 4, 2, 1) if random_width % h == 0)
            context = 77
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.tower = TextTransformer(
                    context_length=context,
                    width=random_width,
                    heads=heads,
                    layers=random_layers,
                    output_dim=random_width,
                )
            self.note = (
                f"RANDOM open-clip text tower (width {random_width}, {random_layers} layers, seed {seed}); "
                "no checkpoint given (text_encoder.path): embeddings carry no meaning"
            )
        self.tower = self.tower.eval().to(self.device)
        self.max_length = min(max_length, context)
        self.width = self.tower.ln_final.weight.shape[0]
        self.tokenizer = open_clip.get_tokenizer("ViT-B-32")  # the CLIP BPE every open-clip text tower uses

    def _encode_batch(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.tokenizer(captions, context_length=self.max_length).to(self.device)
        t = self.tower
        cast = t.transformer.get_cast_dtype()
        x = t.token_embedding(tokens).to(cast) + t.positional_embedding[: tokens.shape[1]].to(cast)
        mask = t.attn_mask[: tokens.shape[1], : tokens.shape[1]] if t.attn_mask is not None else None
        x = t.ln_final(t.transformer(x, attn_mask=mask))
        return x, tokens != 0  # pad id 0; the causal mask keeps padding from affecting real tokens

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "open-clip",
            "arch": self.arch,
            "path": self.path,
            "width": self.width,
            "max_length": self.max_length,
            "note": self.note,
        }


class T5TextEncoder(TextEncoderBase):
    """A T5 or umT5 encoder's last hidden states, from a local transformers folder. The folder's
    config.json model_type picks the class: umT5 gives every layer its own relative position bias
    (T5 only the first), so T5EncoderModel would drop those weights and compute something else."""

    def __init__(
        self,
        path: str,
        max_length: int = 256,
        device: str = "auto",
        batch_size: int = 32,
        dtype: torch.dtype | None = None,
        tokenizer_path: str | None = None,
    ):
        super().__init__(batch_size)
        if not path or not Path(path, "config.json").is_file():
            raise UserInputError(
                f"text_encoder.path: need a local transformers T5 folder with config.json, got {path}"
            )
        from transformers import AutoTokenizer, T5EncoderModel, UMT5EncoderModel

        self.device = select_device(device, "text_encoder.device")
        self.path = str(path)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model_type = json.loads(Path(path, "config.json").read_text()).get("model_type", "t5")
        encoder = UMT5EncoderModel if self.model_type == "umt5" else T5EncoderModel
        # A diffusers pipeline keeps the tokenizer in its own folder beside text_encoder/.
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path)
        # (transformers' own loading bar is off under the CLI: cli._output.silence_library_bars)
        self.model = encoder.from_pretrained(path, dtype=dtype).eval().to(self.device)
        self.max_length = max_length
        self.width = self.model.config.d_model

    def _encode_batch(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(
            captions, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state, mask.bool()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "t5",
            "path": self.path,
            "width": self.width,
            "max_length": self.max_length,
            "model_type": self.model_type,
            "note": f"{self.model_type} encoder from {self.path}",
        }


def build_text_encoder(profile: RunProfile) -> TextEncoderBase:
    """The profile's text encoder (`profile.text_encoder`; the random tower's width defaults to model.text_dim)."""
    cfg = profile.text_encoder
    if cfg.kind == "family":
        spec = family(profile.model.family)
        if spec.text_encoder is None:
            raise UserInputError(
                f"text_encoder.kind: the {spec.name} family has no encoder of its own; use t5 or open-clip"
            )
        return load(spec.text_encoder)(profile)
    if cfg.kind == "t5":
        if cfg.path is None:
            raise UserInputError(
                "text_encoder.path: the t5 encoder needs a local transformers folder; "
                "set --set text_encoder.path=DIR or use text_encoder.kind=open-clip"
            )
        return T5TextEncoder(
            os.fspath(cfg.path), cfg.max_length, cfg.device, cfg.batch_size, tokenizer_path=cfg.tokenizer_path
        )
    return OpenClipTextEncoder(
        cfg.arch,
        cfg.path,
        cfg.max_length,
        cfg.random_width or profile.model.text_dim,
        cfg.random_layers,
        cfg.seed,
        cfg.device,
        cfg.batch_size,
    )
