"""open-clip CoCa captions of evenly spaced keyframes, merged into one caption per clip.

Decoding is greedy with a repetition penalty and a minimum length, written here over CoCa's own forward
pass: open-clip's `generate` imports `BeamSearchScorer` from transformers, which transformers 5 removed,
and then refuses every generation type; greedy decoding is also deterministic, so reruns caption alike.
Keyframes of all clips in a batch go through the model together, `batch_size` images at a time."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from vidforge.curate.captioning.captioners import CaptionResult, ClipItem
from vidforge.curate.scorers.clip_score import OpenClipModel, preprocess_frames
from vidforge.errors import UserInputError

log = logging.getLogger(__name__)

SOT, EOT = 49406, 49407  # open-clip's simple tokenizer: <start_of_text>, <end_of_text>


@torch.no_grad()
def greedy_generate(
    model: Any,
    images: torch.Tensor,
    *,
    max_tokens: int = 30,
    min_tokens: int = 5,
    repetition_penalty: float = 1.0,
) -> torch.Tensor:
    """Token ids (B, <= max_tokens), each row starting with SOT and ending with EOT or cut at max_tokens.
    The penalty divides positive logits (multiplies negative ones) of tokens already in the row, as in
    CTRL and transformers' RepetitionPenaltyLogitsProcessor; EOT is forbidden before `min_tokens`."""
    image_latent, image_embs = model._encode_image(images)
    batch = images.shape[0]
    out = torch.full((batch, 1), SOT, dtype=torch.long, device=images.device)
    done = torch.zeros(batch, dtype=torch.bool, device=images.device)
    pad = getattr(model, "pad_id", 0)
    for step in range(1, max_tokens):
        logits = model(images, out, image_latent=image_latent, image_embs=image_embs, output_labels=False)[
            "logits"
        ]
        logits = logits[:, -1].float()
        if repetition_penalty != 1.0:
            seen = torch.gather(logits, 1, out)
            seen = torch.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
            logits = logits.scatter(1, out, seen)
        if step < min_tokens:
            logits[:, EOT] = float("-inf")
        if step == max_tokens - 1:
            nxt = torch.full((batch,), EOT, dtype=torch.long, device=images.device)
        else:
            nxt = logits.argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == EOT
        if bool(done.all()):
            break
    return out


def decode_tokens(ids: torch.Tensor) -> str:
    """Token ids -> text without the start/end markers and what follows the end."""
    import open_clip

    ids = [int(t) for t in ids]
    if ids and ids[0] == SOT:
        ids = ids[1:]
    if EOT in ids:  # padding (id 0, which is also "!") only follows the end marker
        ids = ids[: ids.index(EOT)]
    return open_clip.decode(torch.tensor(ids, dtype=torch.long)).strip() if ids else ""


def merge_captions(captions: list[str], mode: str = "join") -> str:
    """Keyframe captions (time order) -> one: `join` the distinct ones as sentences, or the `middle` one."""
    if not captions:
        return ""
    if mode == "middle":
        return captions[(len(captions) - 1) // 2]
    seen, sentences = set(), []
    for c in captions:
        c = c.strip().rstrip(".").strip()
        if c and c.lower() not in seen:
            seen.add(c.lower())
            sentences.append(c[0].upper() + c[1:] + ".")
    return " ".join(sentences)


class CocaCaptioner(OpenClipModel):
    name = "coca"
    field = "curation.caption.coca"

    def __init__(self, settings: Any, *, device: str = "cpu", random_weights: bool = False):
        super().__init__(settings, device=device, random_weights=random_weights)
        self.frames = settings.frames

    @property
    def source(self) -> str:
        return f"coca:{self.settings.model}"

    def setup(self) -> None:
        if self.loaded is None:
            super().setup()
            if not hasattr(self.loaded.model, "text_decoder"):
                raise UserInputError(
                    f"curation.caption.coca.model: {self.settings.model} is not a CoCa model; use "
                    "coca_ViT-L-14, coca_ViT-B-32 or a local-dir: CoCa folder"
                )

    def caption_images(self, images: np.ndarray) -> list[str]:
        """One caption per (H, W, 3) uint8 image, `batch_size` at a time."""
        self.setup()
        assert self.loaded is not None
        texts: list[str] = []
        for start in range(0, len(images), self.settings.batch_size):
            batch = preprocess_frames(
                images[start : start + self.settings.batch_size], self.loaded.preprocess
            )
            ids = greedy_generate(
                self.loaded.model,
                batch.to(self.device),
                max_tokens=self.settings.max_tokens,
                repetition_penalty=self.settings.repetition_penalty,
            )
            texts.extend(decode_tokens(row) for row in ids.cpu())
        return texts

    def _caption_group(self, items: list[ClipItem]) -> list[CaptionResult]:
        frames = [item.sample(self.frames) for item in items]
        texts = self.caption_images(np.concatenate(frames))
        results, pos = [], 0
        for f in frames:
            results.append(
                CaptionResult(merge_captions(texts[pos : pos + len(f)], self.settings.merge), self.source)
            )
            pos += len(f)
        return results

    def caption(self, items: list[ClipItem]) -> list[CaptionResult]:
        self.setup()
        try:
            return self._caption_group(items)
        except Exception as err:  # noqa: BLE001 - find the clip(s) that fail, caption the rest
            if len(items) == 1:
                return [CaptionResult(None, self.source, error=f"{type(err).__name__}: {err}")]
            log.warning("CoCa batch failed (%s); captioning its clips one by one", err)
            return [r for item in items for r in self.caption([item])]
