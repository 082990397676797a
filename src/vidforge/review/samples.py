"""The review of sampled videos: a `vidforge infer` output (samples.jsonl: each video with its prompt and
what it came from) and a training run's validation samples (validation/step_*/: one MP4 per prompt)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vidforge.data.manifest import read_jsonl
from vidforge.review.page import Page

# samples.jsonl fields shown for each sample, in this order (`vidforge.infer.run` writes them).
SETTINGS = (
    "seed",
    "sampler",
    "steps",
    "guidance",
    "checkpoint_step",
    "negative_prompt",
    "lora",
    "lora_scale",
)


def load_infer(run_dir: Path) -> Page:
    records = read_jsonl(run_dir / "samples.jsonl")
    skipped = sum(not isinstance(r, dict) for r in records)
    records = [r for r in records if isinstance(r, dict)]
    items = []
    for number, r in enumerate(records, 1):
        meta: dict[str, Any] = {key: r.get(key) for key in SETTINGS if key in r}
        meta["size"] = f"{r.get('frames')} x {r.get('height')} x {r.get('width')}"
        video = r.get("video")  # a record without one is shown without media, not the end of the page
        items.append(
            {
                "id": Path(str(video)).stem if video else f"sample {number}",
                "caption": str(r.get("prompt", "")),
                "meta": meta,
                "scores": {},
                "_media": str(video) if video else None,
                # the image the video started from, as infer recorded it (its absolute path)
                "_inputs": [("input image", str(r["image"]))] if r.get("image") else [],
            }
        )
    checkpoints = sorted({str(r.get("checkpoint")) for r in records if r.get("checkpoint")})
    loras = sorted({str(r.get("lora")) for r in records if r.get("lora")})
    page = Page(
        kind="infer",
        title=f"vidforge infer: {run_dir.name}",
        summary=[("output", str(run_dir)), ("samples", str(len(items)))]
        + [("checkpoint", c) for c in checkpoints]
        + [("lora", c) for c in loras],
        items=items,
    )
    if skipped:
        page.notes.append(f"{skipped} line(s) of samples.jsonl are not records: not shown")
    if records and "sampler" not in records[0]:
        page.notes.append("samples.jsonl predates the sampler settings being recorded: only prompt and seed")
    return page


def validation_items(run_dir: Path, prompts: list[str]) -> list[dict[str, Any]]:
    """The validation samples of a training run, newest step first; a video's prompt is the one its file
    name is the slug of (`vidforge.train.validation` names them so)."""
    from vidforge.sampling.shape import slug

    by_slug = {slug(p): p for p in prompts}
    items = []
    for folder in sorted((run_dir / "validation").glob("step_*"), reverse=True):
        step = int(folder.name.removeprefix("step_"))
        named = _prompts_file(folder)  # what the step sampled (prompts taken from the data's captions too)
        for video in sorted(folder.glob("*.mp4")):
            items.append(
                {
                    "id": f"{folder.name}/{video.stem}",
                    "caption": str(named.get(video.name) or by_slug.get(video.stem, video.stem)),
                    "group": f"step {step}",
                    "meta": {"step": step},
                    "scores": {},
                    "_media": str(video.relative_to(run_dir)),
                }
            )
    return items


def _prompts_file(folder: Path) -> dict[str, Any]:
    """A validation step's prompts.json (video file -> prompt); {} for a step written before it existed
    or a file that is not that mapping."""
    import json

    try:
        named = json.loads((folder / "prompts.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return named if isinstance(named, dict) else {}
