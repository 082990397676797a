"""Deterministic short synthetic videos that exercise the pipeline, with captions and ground truth.

Each video is a sequence of *scenes* drawn from plain numpy (no randomness except a seeded jitter of
start positions and background patterns), encoded with PyAV as H.264 (libx264, yuv420p, constant
frame rate). Beside every `<name>.mp4` the generator writes:

- `<name>.captions.json`: one `{"start", "end", "text"}` per scene, in seconds (end exclusive);
- `<name>.truth.json`: the ground truth (`cuts`: first frame of every new shot; `false_cuts`: frames
  where a detector will cut although the scene goes on; `static_spans` (frames that repeat the one
  before), `text_spans`, `fade_spans` as `[start, end)` frame ranges; `scenes` with their motion: direction and speed in pixels/frame);

and, for the whole folder, `truth.json` (name -> truth) and `captions.csv` (`path,caption`: each video
with its scene captions joined by "; ").

Usage:  python examples/make_sample_videos.py OUT_DIR [--count N] [--seed S] [--demo N]
        (`--count` beyond the fixed catalogue adds seeded random multi-scene videos, e.g. for benchmarks;
        `--width/--height/--seconds` size those extra videos; `--demo N` adds N one-shot training videos
        for each of the demo's prompts, as `make demo` trains on.)

Importable: `make_sample_videos(out_dir, count=None, seed=0)` returns {name: truth}.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import zlib
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np

WIDTH, HEIGHT, FPS = 128, 96, 24
CRF, PRESET = 12, "veryfast"

# Velocities are whole pixels per frame so that the ground-truth positions are exact after rounding.
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
COLOURS = {
    "red": (230, 30, 30),
    "green": (40, 200, 60),
    "blue": (40, 70, 230),
    "yellow": (240, 220, 40),
    "magenta": (220, 40, 200),
    "cyan": (40, 210, 220),
    "white": (245, 245, 245),
    "orange": (245, 140, 20),
}


@dataclass
class Shape:
    """A filled shape moving at a constant integer velocity (pixels per frame)."""

    kind: str  # "square", "circle" or "triangle"
    colour: str
    size: int
    start: tuple[int, int]  # top-left corner (x, y) at the scene's first frame
    direction: str | None = None  # None: it does not move
    speed: int = 0

    @property
    def velocity(self) -> tuple[int, int]:
        if self.direction is None or self.speed == 0:
            return (0, 0)
        dx, dy = DIRECTIONS[self.direction]
        return (dx * self.speed, dy * self.speed)

    def position(self, t: int) -> tuple[int, int]:
        vx, vy = self.velocity
        return (self.start[0] + vx * t, self.start[1] + vy * t)

    def draw(self, frame: np.ndarray, t: int) -> None:
        x, y = self.position(t)
        s, colour = self.size, COLOURS[self.colour]
        if self.kind == "square":
            cv2.rectangle(frame, (x, y), (x + s - 1, y + s - 1), colour, thickness=-1)
        elif self.kind == "circle":
            cv2.circle(frame, (x + s // 2, y + s // 2), s // 2, colour, thickness=-1, lineType=cv2.LINE_AA)
        elif self.kind == "triangle":
            pts = np.array([[x + s // 2, y], [x, y + s - 1], [x + s - 1, y + s - 1]], np.int32)
            cv2.fillPoly(frame, [pts], colour, lineType=cv2.LINE_AA)
        else:
            raise ValueError(f"unknown shape kind {self.kind!r}")

    def truth(self) -> dict:
        vx, vy = self.velocity
        return {
            "shape": self.kind,
            "colour": self.colour,
            "size": self.size,
            "start": list(self.start),
            "direction": self.direction if self.speed else None,
            "speed": self.speed,
            "dx": vx,
            "dy": vy,
        }


@dataclass
class Scene:
    """A run of frames with one background and its shapes. Options add the special cases."""

    frames: int
    caption: str
    background: tuple[tuple[int, int, int], tuple[int, int, int]]  # a vertical gradient, top to bottom colour
    pattern: int = 0  # number of diagonal stripes over the background (0: none); makes scenes look different
    shapes: list[Shape] = field(default_factory=list)
    text: str | None = None  # large centred text
    frozen_from: int | None = None  # from this local frame on, the picture freezes (a static span)
    fade_from: int | None = None  # from this local frame on, fade linearly to black by the scene's end
    flash_at: int | None = (
        None  # a camera flash starts at this local frame: a detector cuts, the scene goes on
    )
    flash_frames: int = 2
    grain: float = 2.5  # std of monochrome camera noise; real footage has it, frozen frames repeat it


def _background(scene: Scene, width: int, height: int) -> np.ndarray:
    top, bottom = (np.array(c, np.float32) for c in scene.background)
    ramp = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    img = np.broadcast_to(top + (bottom - top) * ramp, (height, width, 3)).copy()
    if scene.pattern:
        yy, xx = np.mgrid[0:height, 0:width]
        stripes = np.sin((xx + yy) * (2 * math.pi * scene.pattern / (width + height)))
        img += 25.0 * stripes[..., None].astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _text_box(
    text: str, width: int, height: int
) -> tuple[float, int, tuple[int, int], tuple[int, int, int, int]]:
    """Font scale, thickness, origin and [x0, y0, x1, y1] box of text filling ~80% of the width."""
    font, thickness = cv2.FONT_HERSHEY_SIMPLEX, max(2, width // 48)
    (w, h), base = cv2.getTextSize(text, font, 1.0, thickness)
    scale = 0.8 * width / w
    (w, h), base = cv2.getTextSize(text, font, scale, thickness)
    x, y = (width - w) // 2, (height + h) // 2
    return scale, thickness, (x, y), (x, y - h, x + w, y + base)


def render_scene(scene: Scene, width: int = WIDTH, height: int = HEIGHT, seed: int = 0) -> list[np.ndarray]:
    """The scene's frames as RGB uint8 arrays. Grain is seeded by (seed, frame), so output is repeatable.

    Why grain: the static filter's threshold (mean absolute grey difference 0.9, after Vchitect-2.0) is
    meant for camera footage, where noise alone moves frames apart; a clean synthetic picture with one
    small moving shape would read as static."""
    base = _background(scene, width, height)
    frames = []
    for t in range(scene.frames):
        tt = t if scene.frozen_from is None else min(t, scene.frozen_from)
        frame = base.copy()
        if scene.grain:
            noise = np.random.default_rng([seed, tt]).normal(0.0, scene.grain, (height, width, 1))
            frame = np.clip(frame + noise, 0, 255).astype(np.uint8)
        for shape in scene.shapes:
            shape.draw(frame, tt)
        if scene.text:
            scale, thickness, origin, _ = _text_box(scene.text, width, height)
            cv2.putText(
                frame,
                scene.text,
                origin,
                cv2.FONT_HERSHEY_SIMPLEX,
                scale,
                (10, 10, 10),
                thickness,
                cv2.LINE_AA,
            )
        if scene.flash_at is not None and scene.flash_at <= t < scene.flash_at + scene.flash_frames:
            frame = np.clip(frame.astype(np.float32) * 0.3 + 200, 0, 255).astype(np.uint8)
        if scene.fade_from is not None and t >= scene.fade_from:
            span = scene.frames - scene.fade_from
            gain = 1.0 - (t - scene.fade_from + 1) / span
            frame = (frame.astype(np.float32) * gain).astype(np.uint8)
        frames.append(frame)
    return frames


# --------------------------------------------------------------------------------------------------
# The catalogue. Scene lengths respect PySceneDetect's default minimum scene length (15 frames).


def _jitter(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, high + 1))


def catalogue(seed: int = 0) -> dict[str, list[Scene]]:
    """The fixed sample videos, name -> scenes. `seed` jitters only vertical start positions."""
    rng = np.random.default_rng(seed)
    dark = ((30, 30, 40), (60, 60, 80))
    return {
        # The end-to-end demo trains a tiny model to generate exactly this.
        "red_square": [
            Scene(
                48,
                "a red square moving right",
                dark,
                shapes=[Shape("square", "red", 16, (4, _jitter(rng, 20, 60)), "right", 2)],
            ),
        ],
        # Four visually distinct scenes joined by hard cuts.
        "cuts": [
            Scene(
                30,
                "a red square moving right over blue stripes",
                ((20, 40, 140), (60, 90, 200)),
                pattern=3,
                shapes=[Shape("square", "red", 18, (6, _jitter(rng, 20, 50)), "right", 2)],
            ),
            Scene(
                28,
                "a yellow circle moving down",
                ((20, 110, 40), (80, 170, 70)),
                pattern=5,
                shapes=[Shape("circle", "yellow", 20, (54, 4), "down", 2)],
            ),
            Scene(26, 'the word "HELLO" in large letters', ((235, 235, 225), (200, 200, 190)), text="HELLO"),
            Scene(
                30,
                "a magenta triangle moving left",
                ((70, 20, 20), (140, 60, 30)),
                pattern=2,
                shapes=[Shape("triangle", "magenta", 22, (100, _jitter(rng, 20, 50)), "left", 3)],
            ),
        ],
        # A moving scene, then a frozen frame as its own shot (well over 30% of that clip), then motion.
        "static": [
            Scene(
                30,
                "a blue circle moving right",
                ((200, 190, 120), (230, 220, 160)),
                pattern=4,
                shapes=[Shape("circle", "blue", 20, (4, _jitter(rng, 20, 50)), "right", 3)],
            ),
            Scene(
                48,
                "a still picture of a green square",
                ((60, 20, 80), (20, 10, 40)),
                pattern=6,
                shapes=[Shape("square", "green", 30, (50, 30))],
                frozen_from=0,
            ),
            Scene(
                24,
                "an orange square moving up",
                ((10, 60, 60), (20, 120, 110)),
                pattern=2,
                shapes=[Shape("square", "orange", 18, (60, 70), "up", 2)],
            ),
        ],
        # Large text, then a slow fade to black (no cut inside it), then a new scene.
        "fade_text": [
            Scene(
                30,
                'the word "VIDFORGE" in large letters',
                ((250, 250, 250), (220, 220, 230)),
                text="VIDFORGE",
            ),
            Scene(
                48,
                "a cyan circle moving right, fading to black",
                ((90, 40, 20), (150, 80, 40)),
                pattern=3,
                shapes=[Shape("circle", "cyan", 18, (4, 38), "right", 2)],
                fade_from=16,
            ),
            Scene(
                24,
                "a white square moving down",
                ((20, 80, 30), (40, 140, 60)),
                pattern=4,
                shapes=[Shape("square", "white", 16, (56, 4), "down", 2)],
            ),
        ],
        # One scene interrupted by a two-frame camera flash (a detector cuts there although the same content
        # goes on: the case event stitching undoes), then a true cut to different content.
        "false_split": [
            Scene(
                60,
                "a green square moving right",
                ((40, 40, 90), (90, 90, 150)),
                pattern=3,
                shapes=[Shape("square", "green", 18, (4, _jitter(rng, 20, 50)), "right", 1)],
                flash_at=30,
            ),
            Scene(30, 'the word "STOP" in large letters', ((250, 240, 200), (250, 200, 160)), text="STOP"),
        ],
        # The caption stage's motion test: slow, fast and no motion, one shot each.
        "motion_slow": [
            Scene(
                36,
                "a red square moving right slowly",
                dark,
                shapes=[Shape("square", "red", 16, (10, 40), "right", 1)],
            ),
        ],
        "motion_fast": [
            Scene(
                24,
                "a red square moving right quickly",
                dark,
                shapes=[Shape("square", "red", 16, (2, 40), "right", 4)],
            ),
        ],
        "motion_static": [
            Scene(36, "a red square standing still", dark, shapes=[Shape("square", "red", 16, (56, 40))]),
        ],
    }


def random_scenes(seed: int, seconds: float, fps: int, width: int, height: int) -> list[Scene]:
    """A seeded multi-scene video of about `seconds`: 1-3 s shots with random colours and shapes."""
    rng = np.random.default_rng(seed)
    scenes: list[Scene] = []
    total, names = int(seconds * fps), list(COLOURS)
    while sum(s.frames for s in scenes) < total:
        n = min(int(rng.integers(fps, 3 * fps)), max(16, total - sum(s.frames for s in scenes)))
        top = tuple(int(v) for v in rng.integers(0, 256, 3))
        bottom = tuple(int(v) for v in rng.integers(0, 256, 3))
        size = max(8, height // 5)
        direction = str(rng.choice(list(DIRECTIONS)))
        speed = max(1, int(min(width, height) * 0.5 / n))
        colour, kind = str(rng.choice(names)), str(rng.choice(["square", "circle", "triangle"]))
        start = (width // 2 - size // 2, height // 2 - size // 2)
        scenes.append(
            Scene(
                n,
                f"a {colour} {kind} moving {direction}",
                (top, bottom),
                pattern=int(rng.integers(0, 7)),
                shapes=[Shape(kind, colour, size, start, direction, speed)],
            )
        )
    return scenes


# The demo's prompts, each with the way its square moves: (colour, direction, speeds in pixels/frame).
# Fast enough that in the DEMO_WINDOW frames tokenize keeps the square crosses a third of the frame or more.
DEMO_PROMPTS = (("red", "right", (6, 9)), ("green", "right", (6, 9)), ("white", "down", (4, 6)))
DEMO_FRAMES = 24  # 1 s: curation.min_seconds keeps nothing shorter
DEMO_WINDOW = 9  # the frames tokenize keeps (local_cpu's data.frame_buckets): the square is whole in these
DEMO_SIZES = (24, 32)  # the square's side in pixels: 8-11 at the demo's 32x48, two or three tokens wide
DEMO_ENTRY = 0.2  # the square starts within this share of the frame on the side it comes from


def demo_scenes(
    per_prompt: int, seed: int = 0, width: int = WIDTH, height: int = HEIGHT
) -> dict[str, list[Scene]]:
    """`per_prompt` one-shot videos for each demo prompt, name -> scenes: a square of the named colour
    (DEMO_SIZES) that starts near the side it comes from (DEMO_ENTRY), anywhere across the other axis,
    and crosses a third of the frame or more the named way in the first DEMO_WINDOW frames, on a dark
    background.
    Why this shape: where the square is in each frame then tells the direction by itself (early frames
    on the left, late ones on the right), which the demo's tiny model learns; with start positions
    anywhere, the direction lived only in how frames relate, and the model's samples moved either way
    (docs/benchmarks.md, Demo sweep)."""
    rng = np.random.default_rng([seed, per_prompt])
    out: dict[str, list[Scene]] = {}
    for colour, direction, (slow, fast) in DEMO_PROMPTS:
        dx, dy = DIRECTIONS[direction]
        for k in range(per_prompt):
            size, speed = _jitter(rng, DEMO_SIZES[0], DEMO_SIZES[1]), _jitter(rng, slow, fast)
            reach = speed * (DEMO_WINDOW - 1)  # how far the square goes while tokenize looks
            x = _start(rng, dx, width, size, reach)
            y = _start(rng, dy, height, size, reach)
            shade = _jitter(rng, 20, 60)
            background = ((shade, shade, shade + 10), (shade + 30, shade + 30, shade + 40))
            shape = Shape("square", colour, size, (x, y), direction, speed)
            caption = f"a {colour} square moving {direction}"
            out[f"demo_{colour}_{k:03d}"] = [Scene(DEMO_FRAMES, caption, background, shapes=[shape])]
    return out


def _start(rng: np.random.Generator, moving: int, extent: int, size: int, reach: int) -> int:
    """A start coordinate on one axis: near the entry side along the motion (moving = 1), anywhere the
    square fits across it (moving = 0)."""
    last = extent - size - 2 - reach * moving
    if moving:
        last = min(last, int(DEMO_ENTRY * extent))
    return _jitter(rng, 2, last)


# --------------------------------------------------------------------------------------------------


def encode(
    path: Path,
    frames: list[np.ndarray],
    fps: int = FPS,
    crf: int = CRF,
    preset: str = PRESET,
    *,
    sample_aspect: Fraction | None = None,
    interlaced: bool = False,
    rotation: int = 0,
) -> None:
    """Write RGB frames as constant-frame-rate H.264 (yuv420p) in an MP4. `sample_aspect` marks the pixels
    non-square (the stream's and the codec's, as broadcast encoders write both); `interlaced` codes the
    frames as two fields (x264's interlaced mode, flagged in every frame; bottom field first, see
    write_geometry_samples). `rotation` is a display rotation in degrees, as phones write."""
    height, width = frames[0].shape[:2]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = Fraction(1, fps)
        stream.options = {"crf": str(crf), "preset": preset}
        if sample_aspect is not None:
            stream.sample_aspect_ratio = stream.codec_context.sample_aspect_ratio = sample_aspect
        if interlaced:
            stream.options = {**stream.options, "flags": "+ildct+ilme"}
        if rotation:
            stream.set_display_rotation(rotation)
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def truth_of(name: str, scenes: list[Scene], fps: int, width: int, height: int) -> dict:
    """Ground truth from the scene list: shot boundaries, special spans and motion."""
    cuts, false_cuts, static_spans, text_spans, fade_spans, scene_truths = [], [], [], [], [], []
    start = 0
    for index, scene in enumerate(scenes):
        if index:
            cuts.append(start)
        if scene.flash_at is not None:
            false_cuts.append(start + scene.flash_at)
        if scene.frozen_from is not None:
            # A static span holds the frames that repeat their predecessor: those after `frozen_from`.
            static_spans.append([start + scene.frozen_from + 1, start + scene.frames])
        elif not any(s.speed for s in scene.shapes) and scene.fade_from is None and scene.flash_at is None:
            static_spans.append([start + 1, start + scene.frames])  # nothing moves at all
        if scene.text:
            box = list(_text_box(scene.text, width, height)[3])
            text_spans.append({"start": start, "end": start + scene.frames, "text": scene.text, "box": box})
        if scene.fade_from is not None:
            fade_spans.append([start + scene.fade_from, start + scene.frames])
        scene_truths.append(
            {
                "start": start,
                "end": start + scene.frames,
                "start_s": start / fps,
                "end_s": (start + scene.frames) / fps,
                "caption": scene.caption,
                "motion": [s.truth() for s in scene.shapes],
            }
        )
        start += scene.frames
    return {
        "name": name,
        "file": f"{name}.mp4",
        "fps": fps,
        "width": width,
        "height": height,
        "frames": start,
        "seconds": start / fps,
        "cuts": cuts,
        "false_cuts": false_cuts,
        "static_spans": static_spans,
        "text_spans": text_spans,
        "fade_spans": fade_spans,
        "scenes": scene_truths,
    }


def write_video(
    out_dir: Path, name: str, scenes: list[Scene], fps: int = FPS, width: int = WIDTH, height: int = HEIGHT
) -> dict:
    seed = zlib.crc32(name.encode())
    frames = [f for k, scene in enumerate(scenes) for f in render_scene(scene, width, height, seed + k)]
    encode(out_dir / f"{name}.mp4", frames, fps)
    truth = truth_of(name, scenes, fps, width, height)
    captions = [{"start": s["start_s"], "end": s["end_s"], "text": s["caption"]} for s in truth["scenes"]]
    (out_dir / f"{name}.captions.json").write_text(json.dumps(captions, indent=2) + "\n")
    (out_dir / f"{name}.truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth


# Geometry samples: what cameras and editors leave between the coded picture and what is shown.
ANAMORPHIC_SAR = Fraction(16, 11)  # PAL 16:9 (704x576 coded), here at an eighth: 88x72 shown as 128x72


def _disc_frames(width: int, height: int, frames: int, t_offset: float = 0.0) -> list[np.ndarray]:
    """A white disc (radius height/4) moving right 2 px a frame over a dark grey background, drawn in
    square pixels at `width` x `height`; `t_offset` shifts time by that fraction of a frame."""
    out = []
    r = height // 4
    for i in range(frames):
        img = np.full((height, width, 3), 40, np.uint8)
        x4 = round((r + 4 + 2 * (i + t_offset)) * 4)  # centre in quarter pixels (cv2's shift=2)
        cv2.circle(img, (x4, height * 2), r * 4, (235, 235, 235), -1, cv2.LINE_AA, shift=2)
        out.append(img)
    return out


def _grating_frames(width: int, height: int, frames: int, t_offset: float = 0.0) -> list[np.ndarray]:
    """Vertical bars (a sine grating, period 16 px) moving right 4 px a frame; `t_offset` as above."""
    x = np.arange(width, dtype=np.float64)
    out = []
    for i in range(frames):
        row = 128 + 90 * np.sin(2 * np.pi * (x - 4 * (i + t_offset)) / 16)
        out.append(np.repeat(np.broadcast_to(row, (height, width))[..., None], 3, axis=2).astype(np.uint8))
    return out


def write_geometry_samples(out_dir: str | Path, frames: int = 36) -> dict[str, dict]:
    """Write `anamorphic.mp4` (a disc drawn round at 128x72, stored squeezed in 88x72 with a 16:11 sample
    aspect: round only when shown at its display aspect; `anamorphic_rotated.mp4` the same
    with a 90 degree display rotation) and `interlaced.mp4` (128x96 moving bars, its odd
    lines at a frame's time and its even lines half a frame later, as an interlaced camera films: the
    bars' edges comb), with truth files; return {name: truth} (`display_width`, `sample_aspect`, `interlaced`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    truths = {}
    shown = _disc_frames(128, 72, frames)
    coded_w = round(128 / ANAMORPHIC_SAR)
    squeezed = [cv2.resize(f, (coded_w, 72), interpolation=cv2.INTER_AREA) for f in shown]
    encode(out_dir / "anamorphic.mp4", squeezed, sample_aspect=ANAMORPHIC_SAR)
    encode(out_dir / "anamorphic_rotated.mp4", squeezed, sample_aspect=ANAMORPHIC_SAR, rotation=90)
    truths["anamorphic"] = {
        "file": "anamorphic.mp4",
        "frames": frames,
        "fps": FPS,
        "width": coded_w,
        "height": 72,
        "display_width": 128,
        "sample_aspect": f"{ANAMORPHIC_SAR.numerator}:{ANAMORPHIC_SAR.denominator}",
        "disc_radius": 72 // 4,
    }
    # Bottom field first, as PAL DV cameras film: x264 takes the order from a flag on each frame that PyAV
    # cannot set, and without it codes bottom first.
    first, second = _grating_frames(128, 96, frames), _grating_frames(128, 96, frames, t_offset=0.5)
    woven = []
    for a, b in zip(first, second, strict=True):
        frame = a.copy()
        frame[0::2] = b[0::2]  # the top field (even lines) half a frame after the bottom one
        woven.append(frame)
    encode(out_dir / "interlaced.mp4", woven, interlaced=True)
    np.save(out_dir / "interlaced.first_field_time.npy", np.stack(first))  # what a deinterlacer should give
    truths["interlaced"] = {
        "file": "interlaced.mp4",
        "frames": frames,
        "fps": FPS,
        "width": 128,
        "height": 96,
        "interlaced": True,
        "field_order": "bottom first",
        "progressive": "interlaced.first_field_time.npy",
    }
    for name, truth in truths.items():
        truth["seconds"] = frames / FPS
        (out_dir / f"{name}.truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truths


def make_sample_videos(
    out_dir: str | Path,
    count: int | None = None,
    seed: int = 0,
    *,
    seconds: float = 6.0,
    width: int = WIDTH,
    height: int = HEIGHT,
    fps: int = FPS,
    demo: int = 0,
) -> dict[str, dict]:
    """Write the catalogue (the first `count` of it when count is smaller) plus `count - len(catalogue)`
    random videos, plus `demo` training videos for each demo prompt (demo_scenes); return {name: truth}.
    Same arguments, same bytes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fixed = catalogue(seed)
    n = len(fixed) if count is None else count
    truths: dict[str, dict] = {}
    for name, scenes in list(fixed.items())[:n]:
        truths[name] = write_video(out_dir, name, scenes)
    for k in range(max(0, n - len(fixed))):
        name = f"random_{k:03d}"
        scenes = random_scenes(seed * 1000 + k, seconds, fps, width, height)
        truths[name] = write_video(out_dir, name, scenes, fps, width, height)
    for name, scenes in demo_scenes(demo, seed).items():
        truths[name] = write_video(out_dir, name, scenes)
    (out_dir / "truth.json").write_text(json.dumps(truths, indent=2) + "\n")
    with open(out_dir / "captions.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "caption"])
        for truth in truths.values():
            writer.writerow([truth["file"], "; ".join(s["caption"] for s in truth["scenes"])])
    return truths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python examples/make_sample_videos.py /tmp/samples --count 10",
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--count", type=int, default=None, help="number of videos (default: the catalogue)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each extra random video")
    parser.add_argument("--width", type=int, default=WIDTH, help="width of the extra random videos (even)")
    parser.add_argument("--height", type=int, default=HEIGHT, help="height of the extra random videos (even)")
    parser.add_argument(
        "--geometry", action="store_true", help="also write anamorphic.mp4 and interlaced.mp4"
    )
    parser.add_argument(
        "--demo", type=int, default=0, help="also write N training videos for each demo prompt (make demo)"
    )
    args = parser.parse_args(argv)
    if args.geometry:
        write_geometry_samples(args.out_dir)
    truths = make_sample_videos(
        args.out_dir,
        args.count,
        args.seed,
        seconds=args.seconds,
        width=args.width,
        height=args.height,
        demo=args.demo,
    )
    for truth in truths.values():
        print(f"{args.out_dir / truth['file']}  {truth['frames']} frames, cuts at {truth['cuts']}")


if __name__ == "__main__":
    main()
