"""Throughput of shard writing, tokenize, and the packed loader.

    .venv/bin/python bench/data_pipeline.py [--clips 12] [--frames 17] [--size 64] [--vae wan|none] [--device auto]

Prints one JSON line per measurement. With --vae wan it also reports tokenize end to end against the
VAE's own encode throughput on the same (already decoded and resized) clips: the target is >= 85%."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--size", type=int, default=64, help="clip height; width is 4/3 of it")
    ap.add_argument("--vae", default="wan", choices=["wan", "none"])
    ap.add_argument("--vae-base-dim", type=int, default=8, help="Wan base_dim (96 is the real Wan 2.1 VAE)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--loader-samples", type=int, default=2000)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU. On the shared 2-core machine 2 threads made the VAE 20x "
        "slower than 1 (OpenMP spinning against other processes); 1 gives stable numbers",
    )
    args = ap.parse_args()

    from vidforge.data.batching import Packer
    from vidforge.data.loader import ShardLoader
    from vidforge.data.sharding import run as shard
    from vidforge.data.testing import make_annotated_dir, make_latent_shards
    from vidforge.profile import load_profile
    from vidforge.text import build_text_encoder
    from vidforge.tokenizers.tokenize import run as tokenize

    device = (
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    results = []
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads)

    def report(name: str, **fields) -> None:
        where = (
            torch.cuda.get_device_name()
            if device.startswith("cuda")
            else f"cpu x{torch.get_num_threads()} threads"
        )
        row = {"bench": name, "device": where, **fields}
        results.append(row)
        print(json.dumps(row), flush=True)

    h = args.size
    w = h * 4 // 3 // 16 * 16
    tmp = Path(tempfile.mkdtemp(prefix="vf-bench-"))
    ann = make_annotated_dir(
        tmp / "ann",
        videos=args.clips,
        images=args.clips // 4,
        rejected=0,
        size=(h, w),
        frames=(args.frames, args.frames + 8),
    )
    settings = [
        f"data.buckets=[[{h},{w}]]",
        f"data.frame_buckets=[1,{args.frames}]",
        "data.val_fraction=0",
        "data.shard_max_samples=8",
        f"tokenizer.device={device}",
        f"text_encoder.device={device}",
    ]
    profile = load_profile(None, settings)
    encoder = build_text_encoder(profile)
    t0 = time.perf_counter()
    s = shard(profile, ann, tmp / "shards", encoder=encoder)
    dt = time.perf_counter() - t0
    report(
        "shard",
        samples=s.samples,
        MB=round(s.bytes_written / 1e6, 2),
        seconds=round(dt, 3),
        MB_per_s=round(s.bytes_written / 1e6 / dt, 2),
        samples_per_s=round(s.samples / dt, 1),
        text_encoder=encoder.describe()["kind"],
    )

    t0 = time.perf_counter()
    s = tokenize(profile, tmp / "shards", tmp / "lat-pixel")
    dt = time.perf_counter() - t0
    report("tokenize-pixel", samples=s.samples, seconds=round(dt, 3), clips_per_s=round(s.samples / dt, 2))

    if args.vae == "wan":
        from diffusers import AutoencoderKLWan

        from vidforge.data.buckets import resize_crop
        from vidforge.data.media import read_media
        from vidforge.data.shard_index import read_index
        from vidforge.data.shard_reader import iter_shard
        from vidforge.tokenizers import frames_to_tensor

        torch.manual_seed(0)
        vae_dir = tmp / "wan"
        AutoencoderKLWan(
            base_dim=args.vae_base_dim, z_dim=16, num_res_blocks=2 if args.vae_base_dim >= 64 else 1
        ).save_pretrained(vae_dir)
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
        vprofile = load_profile(
            None, [*settings, "tokenizer.kind=wan", f"tokenizer.path={vae_dir}", f"tokenizer.dtype={dtype}"]
        )
        from vidforge.tokenizers import build_tokenizer

        tok = build_tokenizer(vprofile)
        # The VAE alone on the same clips, decoded and resized beforehand.
        clips = []
        index = read_index(tmp / "shards")
        for entry in index.shards:
            for smp in iter_shard(tmp / "shards" / entry.name, entry):
                ext = next(e for e in smp if e in ("mp4", "png", "jpg", "webp"))
                frames = read_media(smp[ext], "video" if ext == "mp4" else "image", max_frames=args.frames)
                n = args.frames if frames.shape[0] >= args.frames else 1
                clips.append(frames_to_tensor(resize_crop(frames[:n], h, w))[None])
        tok.encode(clips[0].to(tok.device))  # warm-up
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for c in clips:
            tok.encode(c.to(tok.device))
        sync()
        vae_dt = time.perf_counter() - t0
        report(
            "vae-encode-only",
            samples=len(clips),
            seconds=round(vae_dt, 3),
            clips_per_s=round(len(clips) / vae_dt, 3),
            base_dim=args.vae_base_dim,
            dtype=dtype,
        )
        t0 = time.perf_counter()
        s = tokenize(vprofile, tmp / "shards", tmp / "lat-wan", tokenizer=tok)
        dt = time.perf_counter() - t0
        report(
            "tokenize-wan",
            samples=s.samples,
            seconds=round(dt, 3),
            clips_per_s=round(s.samples / dt, 3),
            fraction_of_vae_throughput=round(vae_dt / dt, 3),
            base_dim=args.vae_base_dim,
            dtype=dtype,
        )

    lat = make_latent_shards(
        tmp / "lat-mix",
        shards=8,
        per_shard=250,
        channels=16,
        shapes=((1, 32, 32), (5, 32, 32), (9, 32, 32), (5, 24, 40), (9, 16, 16), (1, 24, 40)),
        text_shape=(77, 32),
    )
    # A loader runs in its own worker process with one intra-op thread; with several threads the patchify
    # copies spin against the trainer (and here against other work on 2 cores): 5x slower measured.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    loader = ShardLoader([lat], shuffle_buffer=256, epochs=None)
    packer = Packer(loader, (1, 2, 2), token_budget=16384, buffer=64)
    n = 0
    t0 = time.perf_counter()
    for batch in packer:
        n += len(batch.keys)
        if n >= args.loader_samples:
            break
    dt = time.perf_counter() - t0
    report(
        "loader-packed",
        samples=n,
        seconds=round(dt, 3),
        samples_per_s=round(n / dt, 1),
        batches=packer.stats["batches"],
        packing_efficiency=round(packer.efficiency, 4),
        token_budget=16384,
        torch_threads=1,
    )
    torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
