"""Benchmark `vidforge clip` against `scenedetect detect-adaptive split-video` and against one plain
decode + encode of the same input (the floor for any tool that re-encodes every frame).

Same input, same x264 crf and preset everywhere. For the comparison, vidforge runs with stitching and
embeddings off and its filters open (min_seconds=0, static_max_ratio=1), so both tools detect with
AdaptiveDetector and encode every shot; the full pipeline (defaults) is timed too.

Usage:  python bench/clip_vs_scenedetect.py [--videos 3 --seconds 30 --width 640 --height 360]
                                           [--crf 23 --preset veryfast] [--ffmpeg PATH] [--set K=V ...]
                                           [--repeat N] [--no-full]
A single 720p source (issue 17's case): --videos 1 --seconds 24 --width 1280 --height 720 --no-full.
scenedetect's split-video needs an `ffmpeg` binary (on PATH, or --ffmpeg, e.g. the one in the
imageio-ffmpeg wheel). Prints a table and one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))


def _seconds(video: Path) -> float:
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        return float(stream.duration * stream.time_base) if stream.duration else container.duration / 1e6


def _cpu_seconds() -> float:
    """User + system CPU of this process's threads and its waited-for children (the CLIs run here)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def timed(fn, *args):
    """(wall seconds, CPU seconds, result) of fn(*args). CPU time hardly moves with the machine's load,
    wall time does: the pair tells a slower run from a busier machine."""
    start, cpu = time.perf_counter(), _cpu_seconds()
    result = fn(*args)
    return time.perf_counter() - start, _cpu_seconds() - cpu, result


def decode_encode(videos: list[Path], out: Path, crf: int, preset: str) -> None:
    """One decode and one x264 encode of every frame: the least work a re-encoding clipper can do."""
    out.mkdir(parents=True, exist_ok=True)
    for video in videos:
        with av.open(str(video)) as src, av.open(str(out / video.name), "w") as dst:
            stream = src.streams.video[0]
            stream.thread_type = "AUTO"
            rate = stream.average_rate
            enc = dst.add_stream("libx264", rate=rate)
            enc.width, enc.height, enc.pix_fmt = stream.width, stream.height, "yuv420p"
            tb = Fraction(rate.denominator, rate.numerator)
            enc.time_base = tb
            enc.options = {"crf": str(crf), "preset": preset}
            for i, frame in enumerate(src.decode(stream)):
                frame = frame.reformat(format="yuv420p")
                frame.pts, frame.time_base = i, tb
                dst.mux(enc.encode(frame))
            dst.mux(enc.encode(None))


def scenedetect_cli(videos: list[Path], out: Path, crf: int, preset: str, ffmpeg_dir: str | None) -> None:
    env = dict(os.environ)
    if ffmpeg_dir:
        env["PATH"] = f"{ffmpeg_dir}:{env['PATH']}"
    args = f"-map 0:v:0 -c:v libx264 -preset {preset} -crf {crf} -an"
    exe = str(Path(sys.executable).with_name("scenedetect"))
    for video in videos:
        subprocess.run(
            [
                exe,
                "-q",
                "-i",
                str(video),
                "-o",
                str(out / video.stem),
                "detect-adaptive",
                "split-video",
                "-a",
                args,
            ],
            check=True,
            env=env,
        )


def vidforge_clip(videos: list[Path], out: Path, sets: list[str]) -> dict:
    exe = str(Path(sys.executable).with_name("vidforge"))
    cmd = [exe, "--json", "clip", *map(str, videos), "-o", str(out)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode not in (0, 3):
        raise RuntimeError(proc.stderr or proc.stdout)
    return [json.loads(x) for x in proc.stdout.splitlines() if '"result"' in x][-1]


def vidforge_in_process(videos: list[Path], out: Path, sets: list[str]) -> dict:
    """`vidforge clip`'s per-frame work without its process: each source analysed and its shots recorded
    by this process, vidforge already imported. Against the CLI's time in the same round, the difference
    is the command's start-up (interpreter, imports, profile) and its bookkeeping after the shots."""
    from vidforge.curate.clipping.decode import analyse
    from vidforge.profile import load_profile

    cfg = load_profile(None, sets).curation
    return {"clips": sum(len(analyse(str(v), cfg, out).recorded) for v in videos)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--videos", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=360)
    p.add_argument("--crf", type=int, default=23)
    p.add_argument("--preset", default="veryfast")
    p.add_argument("--ffmpeg", default=None, help="ffmpeg binary for scenedetect split-video")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=1, help="run everything this many times; report the fastest")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        help="extra profile override for both vidforge runs, e.g. curation.record_shots=false",
    )
    p.add_argument(
        "--no-full", action="store_true", help="skip the full-pipeline run (single-source speed checks)"
    )
    p.add_argument(
        "--source",
        type=Path,
        action="append",
        default=[],
        help="a real video to clip instead of generated ones (repeatable), e.g. PySceneDetect's testvideo.mp4",
    )
    p.add_argument(
        "--only-floor",
        action="store_true",
        help="time only the floor, vidforge's same-work run and the same analysis in this process (its "
        "per-frame work without the command's start-up); no scenedetect, no recording process",
    )
    args = p.parse_args()
    from make_sample_videos import catalogue, make_sample_videos

    work = args.workdir or Path(tempfile.mkdtemp(prefix="vidforge-bench-"))
    if args.source:
        videos = [v.resolve() for v in args.source]
    else:
        inputs = work / "inputs"
        make_sample_videos(
            inputs,
            count=len(catalogue()) + args.videos,
            seconds=args.seconds,
            width=args.width,
            height=args.height,
        )
        videos = sorted(inputs.glob("random_*.mp4"))
    frames = sum(av.open(str(v)).streams.video[0].frames for v in videos)
    seconds_in = sum(_seconds(v) for v in videos)
    ffmpeg_dir = str(Path(args.ffmpeg).resolve().parent) if args.ffmpeg else None
    if not args.only_floor and not (ffmpeg_dir or shutil.which("ffmpeg")):
        sys.exit("scenedetect split-video needs ffmpeg: put it on PATH or pass --ffmpeg PATH")
    same = [f"curation.crf={args.crf}", f"curation.preset={args.preset}", *args.sets]
    fair = [
        *same,
        "curation.stitch=false",
        "curation.embed=false",
        "curation.min_seconds=0",
        "curation.static_max_ratio=1",
        "curation.max_seconds=100000",
    ]
    if args.only_floor:  # imported before the clock starts: the in-process row times no start-up
        import vidforge.curate.clipping.decode  # noqa: F401
        import vidforge.profile  # noqa: F401
    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {}
    cpu_runs: dict[str, list[float]] = {}
    summaries = {}
    for r in range(args.repeat):  # interleaved, each into a fresh directory (a vidforge rerun is a no-op)
        jobs = {
            "decode+encode": (decode_encode, videos, work / f"plain{r}", args.crf, args.preset),
            "scenedetect CLI": (scenedetect_cli, videos, work / f"sd{r}", args.crf, args.preset, ffmpeg_dir),
            "vidforge clip (same work)": (vidforge_clip, videos, work / f"vf_fair{r}", fair),
            # The same with the shots recorded by a second process (curation.record_process, off by
            # default): what it buys or costs, in the same run.
            "vidforge clip (same work, recording process)": (
                vidforge_clip,
                videos,
                work / f"vf_two{r}",
                [*fair, "curation.record_process=true"],
            ),
            "vidforge clip (full pipeline)": (vidforge_clip, videos, work / f"vf_full{r}", same),
            "vidforge analysis in-process (no start-up)": (
                vidforge_in_process,
                videos,
                work / f"vf_in{r}",
                fair,
            ),
        }
        if args.no_full or args.only_floor:
            del jobs["vidforge clip (full pipeline)"]
        if args.only_floor:
            del jobs["scenedetect CLI"], jobs["vidforge clip (same work, recording process)"]
        else:
            del jobs["vidforge analysis in-process (no start-up)"]
        for name, (fn, *fn_args) in jobs.items():
            seconds, cpu, summaries[name] = timed(fn, *fn_args)
            runs.setdefault(name, []).append(seconds)
            cpu_runs.setdefault(name, []).append(cpu)
    # The fastest of the repeats: on a shared machine the noise only ever adds time.
    results = {name: min(times) for name, times in runs.items()}
    sd_clips = sum(1 for _ in (work / "sd0").rglob("*.mp4"))
    ours = results["vidforge clip (same work)"]

    def ratio(a: str, b: str) -> float | None:
        return round(results[a] / results[b], 2) if a in results and b in results else None

    described = ", ".join(v.name for v in args.source) or (
        f"{args.videos} x {args.seconds:g} s, {args.width}x{args.height}"
    )
    report = {
        "input": f"{described}, {frames} frames, {seconds_in:.1f} s",
        "crf": args.crf,
        "preset": args.preset,
        "sets": args.sets,
        "cpus": os.cpu_count(),
        "repeats": args.repeat,
        "seconds": {k: round(v, 2) for k, v in results.items()},
        "all_seconds": {k: [round(t, 2) for t in v] for k, v in runs.items()},
        # Load average (1, 5, 15 min) before and after: the machine may be shared; compare ratios.
        "load_average": [[round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]],
        "clips": {
            "scenedetect": sd_clips,
            "vidforge_same_work": summaries["vidforge clip (same work)"]["clips"],
            "vidforge_full": summaries.get("vidforge clip (full pipeline)", {}).get("clips"),
        },
        "speedup_vs_scenedetect": ratio("scenedetect CLI", "vidforge clip (same work)"),
        "ratio_to_decode_encode": ratio("vidforge clip (same work)", "decode+encode"),
        "ratio_to_decode_encode_in_process": ratio(
            "vidforge analysis in-process (no start-up)", "decode+encode"
        ),
        "ratio_to_decode_encode_recording_process": ratio(
            "vidforge clip (same work, recording process)", "decode+encode"
        ),
        # Per round (interleaved): ours over the floor measured beside it, and scenedetect over ours.
        "rounds_ratio_to_decode_encode": [
            round(v / f, 2)
            for v, f in zip(runs["vidforge clip (same work)"], runs["decode+encode"], strict=True)
        ],
        "rounds_speedup_vs_scenedetect": [
            round(sd / v, 2)
            for sd, v in zip(runs.get("scenedetect CLI", []), runs["vidforge clip (same work)"], strict=False)
        ],
        "x_realtime_same_work": round(seconds_in / ours, 2),
        # CPU seconds (all threads; a CLI's with its waited-for children) and ours over the floor's, by round.
        "all_cpu_seconds": {k: [round(t, 2) for t in v] for k, v in cpu_runs.items()},
        "rounds_cpu_ratio_to_decode_encode": [
            round(v / f, 2)
            for v, f in zip(cpu_runs["vidforge clip (same work)"], cpu_runs["decode+encode"], strict=True)
        ],
    }
    for name, secs in results.items():
        print(f"{name:32s} {secs:8.2f} s")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
