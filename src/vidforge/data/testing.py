"""Small synthetic inputs for tests and benchmarks: an annotated directory in the layout `vidforge
caption` writes (clips/, manifest.jsonl with clip fields, caption, keep, reasons, media), a clip folder in
the layout `vidforge clip` writes, and latent shards."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vidforge.data.manifest import stable_id, write_jsonl
from vidforge.data.media import write_video

WORDS = (
    "a red ball rolls across a wooden table while the camera slowly pans to the left under warm light "
    "a dog runs along the beach at sunset waves breaking behind it city traffic at night seen from above"
).split()


# Profile overrides that fit make_annotated_dir's clips (48x64 around, 9-20 frames): one sample a shard, a
# 16-token text tower, 4x spatial compression; small and quick for shard/tokenize tests.
SMALL_SHARD_SETS = (
    "data.buckets=[[48,64],[64,48],[64,64]]",
    "data.frame_buckets=[1,5,9]",
    "data.shard_max_samples=1",
    "data.val_fraction=0",
    "text_encoder.max_length=16",
    "tokenizer.spatial_compression=4",
)


def make_clips_dir(out: str | os.PathLike, videos: dict[str, dict]) -> Path:
    """A stand-in for a `vidforge clip` output: each video whole as one clip. `videos` maps a video's path
    to its ground truth (`frames`, `seconds`, `fps`, `width`, `height`, as make_sample_videos writes)."""
    import shutil

    out = Path(out)
    (out / "clips").mkdir(parents=True, exist_ok=True)
    records = []
    for source, truth in videos.items():
        cid = stable_id(source, 0, truth["frames"])
        shutil.copy(source, out / "clips" / f"{cid}.mp4")
        records.append(
            {
                "clip_id": cid,
                "source": str(source),
                "start_frame": 0,
                "end_frame": truth["frames"],
                "start_s": 0.0,
                "end_s": truth["seconds"],
                "fps": truth["fps"],
                "width": truth["width"],
                "height": truth["height"],
                "frames": truth["frames"],
                "media": f"clips/{cid}.mp4",
            }
        )
    write_jsonl(out / "manifest.jsonl", records)
    return out


def synthetic_frames(frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """Moving gradients and a square: compressible, but every frame differs."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 255, 3)
    out = np.empty((frames, height, width, 3), np.uint8)
    for t in range(frames):
        for c in range(3):
            out[t, :, :, c] = (base[c] + 2 * xx + 3 * yy + 5 * t * (c + 1)) % 256
        y0, x0 = (4 * t) % max(1, height - 8), (3 * t) % max(1, width - 8)
        out[t, y0 : y0 + 8, x0 : x0 + 8] = 255
    return out


def make_annotated_dir(
    out: str | os.PathLike,
    videos: int = 4,
    images: int = 2,
    rejected: int = 1,
    size: tuple[int, int] = (48, 64),
    frames: tuple[int, int] = (9, 20),
    seed: int = 0,
    caption_words: tuple[int, int] = (4, 30),
) -> Path:
    """Write `videos` mp4 clips and `images` images (png, jpg, webp in turn) plus `rejected` clips with
    keep=false, and the manifest. Sizes vary around `size` (H, W); frame counts within `frames`."""
    out = Path(out)
    (out / "clips").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    records = []
    for i in range(videos + images + rejected):
        is_image = videos <= i < videos + images
        h = int(size[0] + 16 * rng.integers(0, 2))
        w = int(size[1] + 16 * rng.integers(-1, 2))
        n = 1 if is_image else int(rng.integers(frames[0], frames[1] + 1))
        clip_id = stable_id("synthetic", seed, i)
        ext = ("png", "jpg", "webp")[(i - videos) % 3] if is_image else "mp4"
        media = f"clips/{clip_id}.{ext}"
        pixels = synthetic_frames(n, h, w, seed * 1000 + i)
        if is_image:
            from PIL import Image

            Image.fromarray(pixels[0]).save(out / media, **({"lossless": True} if ext == "webp" else {}))
        else:
            write_video(out / media, pixels, fps=8)
        caption = " ".join(rng.choice(WORDS, int(rng.integers(*caption_words))))
        keep = i < videos + images
        records.append(
            {
                "clip_id": clip_id,
                "source": f"synthetic/{i}.mp4",
                "start_frame": 0,
                "end_frame": n,
                "start_s": 0.0,
                "end_s": n / 8,
                "fps": 8.0,
                "width": w,
                "height": h,
                "frames": n,
                "caption": caption,
                "keep": keep,
                "reasons": [] if keep else ["too static"],
                "media": media,
            }
        )
    write_jsonl(out / "manifest.jsonl", records)
    return out


def make_latent_shards(
    out: str | os.PathLike,
    shards: int = 4,
    per_shard: int = 6,
    channels: int = 4,
    shapes: tuple[tuple[int, int, int], ...] = ((1, 4, 4), (2, 4, 6), (3, 6, 4), (5, 4, 4)),
    text_shape: tuple[int, int] = (8, 16),
    seed: int = 0,
    val_shards: int = 0,
) -> Path:
    """Latent shards as `vidforge tokenize` writes them (latent.npy (C, T, H, W), text_emb/mask, json, txt)
    with the index, filled so every value identifies its sample: latent = sample number + position/1000."""
    from vidforge.data.shard_index import write_index
    from vidforge.data.shard_writer import ShardWriter, json_bytes, npy_bytes

    out = Path(out)
    rng = np.random.default_rng(seed)
    entries = []
    number = 0
    for s in range(shards + val_shards):
        split = "train" if s < shards else "val"
        with ShardWriter(out / f"{split}-{s:06d}.tar") as writer:
            for _ in range(per_shard):
                t, h, w = shapes[int(rng.integers(len(shapes)))]
                latent = (number + np.arange(channels * t * h * w).reshape(channels, t, h, w) / 1e4).astype(
                    np.float32
                )
                length = int(rng.integers(1, text_shape[0] + 1))
                mask = np.arange(text_shape[0]) < length
                emb = (rng.standard_normal(text_shape) * mask[:, None]).astype(np.float16)
                key = f"s{number:06d}"
                writer.add(
                    key,
                    {
                        "latent.npy": npy_bytes(latent),
                        "text_emb.npy": npy_bytes(emb),
                        "text_mask.npy": npy_bytes(mask),
                        "txt": f"caption {number}".encode(),
                        "json": json_bytes({"key": key, "number": number, "latent_shape": latent.shape}),
                    },
                )
                number += 1
            entries.append({**writer.close(), "split": split, "bucket": "all"})
    write_index(out, "latent", entries, created_by="vidforge.data.testing")
    return out
