"""Everything that can refuse a fine-tune, checked before its first stage starts (a refusal after an hour
of tokenizing is a refusal too late): the device the profile asks for, the token budget against the
buckets, the validation size, the memory fit, and the videos too short for every frame bucket.

Short videos follow musubi-tuner's `frame_extraction: head` (a clip's first N frames; a video with fewer
is left out): a video shorter than the shortest `data.frame_buckets` entry at the frame rate the clips are
re-timed to is dropped before `clip` runs, named by its source in RUN/errors.jsonl and in a notice; a run
left with no video is refused."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from vidforge.data.token_budget import bucket_tokens
from vidforge.errors import UserInputError
from vidforge.files import atomic_file
from vidforge.finetune.sizing import training_clip
from vidforge.profile import RunProfile

ERRORS = "errors.jsonl"


def check_accelerator(profile: RunProfile) -> None:
    """The accelerator kind the profile asks for is here (CUDA asked for with no GPU visible: refused)."""
    from vidforge.device import select_device

    try:
        select_device(profile.cluster.accelerator.kind)
    except UserInputError:
        raise UserInputError(
            f"cluster.accelerator={profile.cluster.accelerator.name}: the profile asks for CUDA but no GPU is "
            "visible; --set cluster.accelerator=cpu (or run where the GPU is)"
        ) from None


def check_buckets(profile: RunProfile) -> None:
    """Every bucket tokenizes and samples (height and width multiples of the VAE's compression times the
    patch) and fits data.token_budget, so no clip is skipped by the packer."""
    cs, ct = profile.tokenizer.spatial_compression, profile.tokenizer.temporal_compression
    _, ph, pw = profile.model.patch
    for h, w in profile.data.buckets:
        for name, size, patch in (("height", h, ph), ("width", w, pw)):
            if size % (cs * patch):
                fit = max(cs * patch, size // (cs * patch) * cs * patch)
                raise UserInputError(
                    f"data.buckets: {name} {size} of [{h},{w}] is not a multiple of {cs * patch} (the VAE's "
                    f"{cs}x times the patch's {patch}); e.g. {fit}"
                )
    for f in profile.data.frame_buckets:
        if (f - 1) % ct:
            raise UserInputError(
                f"data.frame_buckets: {f} is not {ct}k+1 for the VAE's {ct}x temporal compression; e.g. "
                f"{(f - 1) // ct * ct + 1}"
            )
    if profile.data.packing:
        (f, h, w), tokens = max(bucket_tokens(profile).items(), key=lambda kv: kv[1])
        if tokens > profile.data.token_budget:
            raise UserInputError(
                f"data.token_budget={profile.data.token_budget}: the bucket of {f} frames at {h}x{w} is "
                f"{tokens} tokens and would be skipped; --set data.token_budget={tokens}, or drop the --set "
                "(finetune sizes it from the buckets)"
            )


def check_validation(profile: RunProfile) -> None:
    """The validation videos' size samples with this VAE and patch (what infer refuses at the first
    validation otherwise)."""
    cs = profile.tokenizer.spatial_compression
    _, ph, pw = profile.model.patch
    cfg = profile.infer
    for name, size, patch in (("height", cfg.height, ph), ("width", cfg.width, pw)):
        if size % (cs * patch):
            frames, height, width = training_clip(profile)
            raise UserInputError(
                f"infer.{name}={size}: validation samples need a multiple of {cs * patch}; drop the --set "
                f"(finetune validates at the trained {height}x{width}) or pick one"
            )
    if (cfg.frames - 1) % profile.tokenizer.temporal_compression:
        raise UserInputError(
            f"infer.frames={cfg.frames}: validation samples need "
            f"{profile.tokenizer.temporal_compression}k+1 frames; drop the --set or pick one"
        )


def video_frames(path: Path, fps: float) -> int | None:
    """Frames of `path` once re-timed to `fps` (None: unreadable, left for `clip` to report)."""
    from vidforge.data.media import MediaError, probe

    try:
        info = probe(path, "video")
    except MediaError:
        return None
    if not info["fps"]:
        return info["frames"]
    return math.floor(info["frames"] * fps / info["fps"] + 1e-6)


def drop_short(
    pairs: Sequence[tuple[Path, str]],
    profile: RunProfile,
    out: Path,
    notice: Callable[[str], None],
) -> list[tuple[Path, str]]:
    """`pairs` less the videos shorter than the shortest frame bucket at curation.fps (the module's rule),
    each written to RUN/errors.jsonl as {source, stage: finetune, reason}; refused when none is left."""
    need = min(profile.data.frame_buckets)
    fps = profile.curation.fps
    kept, short = [], []
    for video, caption in pairs:
        frames = video_frames(video, fps) if fps else None
        if frames is not None and frames < need:
            short.append((video, frames))
        else:
            kept.append((video, caption))
    if not short:
        (out / ERRORS).unlink(missing_ok=True)  # an earlier run's, about videos since lengthened or removed
        return kept
    if not kept:
        video, frames = short[0]
        raise UserInputError(
            f"{video}: {frames} frames at {fps:g} fps, fewer than data.frame_buckets' shortest {need} (and so "
            f"are all {len(short)} videos); add a shorter bucket, e.g. --set data.frame_buckets=[{need},"
            f"{_shorter_bucket(profile, min(f for _, f in short))}], or give longer videos"
        )
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(out / ERRORS, "w", encoding="utf-8") as f:
        for video, frames in short:
            reason = f"{frames} frames at {fps:g} fps, fewer than data.frame_buckets' shortest {need}"
            f.write(json.dumps({"source": str(video), "stage": "finetune", "reason": reason}) + "\n")
    notice(
        f"left out {len(short)} video(s) shorter than {need} frames at {fps:g} fps (see {out / ERRORS}), "
        f"e.g. {short[0][0]}"
    )
    return kept


def _shorter_bucket(profile: RunProfile, frames: int) -> int:
    ct = profile.tokenizer.temporal_compression
    return max(1, (frames - 1) // ct * ct + 1)
