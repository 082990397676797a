"""Writing what `vidforge infer` sampled: one MP4 a prompt, a contact sheet, and samples.jsonl (what
every sample came from, for `vidforge review` and whoever compares samples later)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.data.manifest import write_jsonl
from vidforge.infer.weights import exported_step
from vidforge.profile import RunProfile
from vidforge.sampling.shape import slug
from vidforge.sampling.writers import contact_sheet, write_mp4


@dataclass
class InferResult:
    """What rank 0 wrote (other ranks of a parallel run return an empty result)."""

    videos: list[str]
    contact_sheet: str
    seconds: float
    seconds_per_video: float
    model_calls: int = 0
    """Network calls over all batches (a guided call runs both branches at once), skipped ones included."""
    skipped_calls: int = 0
    """Of those, the calls step caching (infer.cache) skipped."""


def sample_settings(
    prof: RunProfile,
    checkpoint: str | Path,
    export: Path | None,
    negative: str | None,
    image: str | Path | None = None,
    lora: str | Path | None = None,
    lora_scale: float = 1.0,
) -> dict[str, Any]:
    """What every sample of a run came from, recorded beside each in samples.jsonl: the sampling settings,
    the caption of the unguided branch (`negative`; None for the null caption), the weights (`export`'s
    training step), the image and the LoRA adapter."""
    d = prof.diffusion
    return {
        "sampler": d.sampler,
        "steps": d.steps,
        "guidance": d.guidance,
        **({"guidance_2": d.guidance_2} if d.guidance_2 is not None else {}),
        "negative_prompt": negative,
        "cache_threshold": prof.infer.cache.threshold,
        "checkpoint_step": exported_step(export) if export is not None else None,
        "checkpoint": str((export if export is not None else Path(checkpoint)).resolve()),
        **({"image": str(Path(image).resolve())} if image is not None else {}),
        **({"lora": str(Path(lora).resolve()), "lora_scale": lora_scale} if lora is not None else {}),
    }


def summary_note(settings: dict[str, Any], cache_threshold: float, calls: int, skipped: int) -> str:
    """The contact sheet's caption: sampler, steps, guidance, the checkpoint's step and what caching skipped."""
    note = f"{settings['sampler']} {settings['steps']} steps, guidance {settings['guidance']:g}"
    if settings["checkpoint_step"] is not None:
        note += f", step {settings['checkpoint_step']}"
    if skipped:
        note += f", infer.cache {cache_threshold:g}: {skipped} of {calls} calls skipped"
    return note


class SampleWriter:
    """Rank 0's output folder: each video as it is decoded, then the contact sheet and samples.jsonl."""

    def __init__(self, out: Path, fps: int, crf: int, settings: dict[str, Any]):
        self.out, self.fps, self.crf, self.settings = out, fps, crf, settings
        out.mkdir(parents=True, exist_ok=True)
        self.records: list[dict[str, Any]] = []
        self.videos: list[np.ndarray] = []

    def add(self, index: int, prompt: str, seed: int, frames: np.ndarray, **counts: Any) -> None:
        """Write video number `index` (frames (T, H, W, 3) uint8) and record it with `counts`."""
        path = self.out / f"{index:03d}_{slug(prompt)}.mp4"
        write_mp4(path, frames, self.fps, self.crf)
        self.videos.append(frames)
        self.records.append(
            {
                "prompt": prompt,
                "seed": seed,
                "video": path.name,
                "frames": len(frames),
                "height": frames.shape[1],
                "width": frames.shape[2],
                **self.settings,
                **counts,
            }
        )

    def result(self, sheet: Path, seconds: float, calls: int, skipped: int) -> InferResult:
        """What this writer wrote, as `run` returns it."""
        return InferResult(
            [str(self.out / r["video"]) for r in self.records],
            str(sheet),
            seconds,
            seconds / len(self.records),
            calls,
            skipped,
        )

    def finish(self, note: str) -> Path:
        """The contact sheet (captioned with `note`) and samples.jsonl; returns the sheet's path."""
        sheet = self.out / "contact_sheet.png"
        contact_sheet(sheet, self.videos, [r["prompt"] for r in self.records], note=note)
        write_jsonl(self.out / "samples.jsonl", self.records)
        return sheet
