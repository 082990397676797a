"""Clips per second of each `vidforge caption` annotation on this machine.

Models are the real architectures with random weights (compute does not depend on the weights): CLIP
ViT-L/14 for the aesthetic score and caption match, CoCa (ViT-B/32 by default) for captions, EasyOCR's
CRAFT + english_g2 recogniser written in EasyOCR's own format. Clips are the sample-video
generator's seeded random multi-scene videos at --width x --height (4 s, 24 fps), each taken as one clip.

Usage: python bench/caption_annotations.py [--clips 8] [--width 640 --height 360] [--device auto]
       [--clip-model ViT-L-14] [--coca-model coca_ViT-B-32] [--skip coca,ocr]
Prints one JSON object (and a markdown table) with clips/s per annotation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def write_random_easyocr(folder: Path) -> None:
    """Random-weight CRAFT and english_g2 files in EasyOCR's format, their MD5s registered in its table."""
    import easyocr.config as cfg
    import torch
    from easyocr.craft import CRAFT
    from easyocr.model.vgg_model import Model
    from easyocr.utils import CTCLabelConverter

    info = cfg.recognition_models["gen2"]["english_g2"]
    rec = Model(1, 256, 256, len(CTCLabelConverter(info["characters"], {}, {}).character))
    torch.save({f"module.{k}": v for k, v in rec.state_dict().items()}, folder / info["filename"])
    torch.save(CRAFT(pretrained=False).state_dict(), folder / cfg.detection_models["craft"]["filename"])
    info["md5sum"] = hashlib.md5((folder / info["filename"]).read_bytes()).hexdigest()
    craft = folder / cfg.detection_models["craft"]["filename"]
    cfg.detection_models["craft"]["md5sum"] = hashlib.md5(craft.read_bytes()).hexdigest()


def make_clips(root: Path, count: int, width: int, height: int) -> Path:
    from make_sample_videos import catalogue, make_sample_videos

    from vidforge.data.testing import make_clips_dir

    videos = root / "videos"
    extra = len(catalogue())  # the random videos (sized width x height) come after the fixed catalogue
    truth = make_sample_videos(videos, count=extra + count, seed=0, width=width, height=height, seconds=4.0)
    chosen = sorted((k, v) for k, v in truth.items() if k not in catalogue())[:count]
    return make_clips_dir(root / "clips_run", {videos / t["file"]: t for _, t in chosen})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=8)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--clip-model", default="ViT-L-14")
    ap.add_argument("--coca-model", default="coca_ViT-B-32")
    ap.add_argument("--skip", default="", help="comma-separated: coca, ocr")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))

    import torch

    from vidforge.curate.caption import run
    from vidforge.curate.captioning.annotator import CaptionAnnotator
    from vidforge.profile import load_profile

    work = Path(tempfile.mkdtemp(prefix="vidforge-bench-caption-"))
    try:
        clips = make_clips(work, args.clips, args.width, args.height)
        ocr_dir = work / "easyocr"
        ocr_dir.mkdir()
        if "ocr" not in skip:
            write_random_easyocr(ocr_dir)
        sets = [
            f"curation.caption.backend={'sidecar' if 'coca' in skip else 'coca'}",
            f"curation.caption.coca.model={args.coca_model}",
            f"curation.caption.clip.model={args.clip_model}",
            f"curation.caption.device={args.device}",
            "curation.caption.random_weights=true",
            f"curation.caption.ocr.enabled={'false' if 'ocr' in skip else 'true'}",
            f"curation.caption.ocr.model_dir={ocr_dir}",
        ]
        profile = load_profile(None, sets)
        annotator = CaptionAnnotator(profile.curation.caption, clips)
        t0 = time.perf_counter()
        annotator.setup()
        setup_s = time.perf_counter() - t0
        summary = run(profile, clips, work / "out", annotator=annotator)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    device = (
        torch.cuda.get_device_name(0)
        if annotator.device == "cuda"
        else f"CPU ({platform.processor() or 'x86_64'})"
    )
    report = {
        "device": device,
        "threads": torch.get_num_threads(),
        "clips": summary.clips,
        "clip_size": f"{args.width}x{args.height}",
        "clip_model": args.clip_model,
        "coca_model": None if "coca" in skip else args.coca_model,
        "setup_s": round(setup_s, 2),
        "wall_s": summary.wall_seconds,
        "timings": summary.timings,
    }
    print(json.dumps(report, indent=2))
    print("\n| annotation | clips | seconds | clips/s |\n|---|---|---|---|")
    for step, t in summary.timings.items():
        print(f"| {step} | {t['clips']} | {t['seconds']:.2f} | {t['clips_per_s']} |")


if __name__ == "__main__":
    main()
