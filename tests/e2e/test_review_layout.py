"""The review page's cards at the widths people read them (issue 44 item 9): a strip of 480x832 frames
stays inside its card on the train page and the infer page at 1280 and 1920 px, the page needs no
horizontal scroll; the infer page shows the LoRA and the input image its run recorded. The runs are
written by hand (records and videos as `vidforge infer` and `train` lay them out), so the browser is the
slow part. VIDFORGE_REVIEW_SCREENSHOTS=DIR keeps the screenshots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.data.manifest import write_jsonl
from vidforge.data.media import write_video

PROMPTS = ["a red square moving right", "a blue circle on the grass", "the red circle"]
CARDS = "[...document.querySelectorAll('#items .item.card')]"


def _video(path: Path, seed: int) -> None:
    # 480x832's shape at half the pixels (the strip is 64 px high either way), smooth: quick to encode
    ramp = np.linspace(0, 255, 416, dtype=np.float32)[None, None, :, None]
    frames = np.broadcast_to((ramp + 20 * seed) % 256, (9, 240, 416, 3)).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_video(path, frames, fps=16)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("review_layout")
    image = root / "inputs" / "first_frame.png"
    image.parent.mkdir()
    Image.fromarray(np.full((240, 416, 3), 200, np.uint8)).save(image)
    infer = root / "samples"
    records = []
    for i, prompt in enumerate(PROMPTS):
        _video(infer / f"{i:03d}.mp4", i)
        records.append(
            {"prompt": prompt, "video": f"{i:03d}.mp4", "seed": i, "sampler": "unipc", "steps": 4,
             "frames": 9, "height": 480, "width": 832, "checkpoint": str(root / "wan"),
             "image": str(image), "lora": str(root / "runs" / "my_lora"), "lora_scale": 0.8}
        )  # fmt: skip
    write_jsonl(infer / "samples.jsonl", records)
    train = root / "train"
    write_jsonl(train / "metrics.jsonl", [{"step": s, "loss": 1.0 / s, "lr": 1e-4} for s in (1, 2)])
    for step in (2, 4):
        for i in range(len(PROMPTS)):
            _video(train / "validation" / f"step_{step:08d}" / f"{i}.mp4", step + i)
        names = {f"{i}.mp4": p for i, p in enumerate(PROMPTS)}
        (train / "validation" / f"step_{step:08d}" / "prompts.json").write_text(json.dumps(names))
    pages = {}
    for name, run in (("infer", infer), ("train", train)):
        result = CliRunner().invoke(app, ["--json", "review", str(run)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        pages[name] = Path(json.loads(result.output.splitlines()[-1])["page"])
    return pages


@pytest.mark.parametrize("width", [1280, 1920])
@pytest.mark.parametrize("kind", ["train", "infer"])
def test_thumbnail_strips_stay_inside_their_cards(runs, browser, tmp_path, kind, width) -> None:
    browser.call(
        "Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False
    )
    try:
        browser.open(runs[kind].as_uri())
        browser.wait_for("[...document.images].every(i => i.complete)")
        boxes = browser.js(
            f"{CARDS}.map(c => {{ const r = c.getBoundingClientRect();"
            " return [r.left, r.right, [...c.querySelectorAll('img')].map(i => {"
            " const b = i.getBoundingClientRect(); return [b.left, b.right, i.naturalWidth]; })]; })"
        )
        assert len(boxes) == len(PROMPTS) * (2 if kind == "train" else 1)
        for left, right, images in boxes:
            assert images and all(w > 0 for _, _, w in images)  # every thumbnail loaded
            for start, end, _ in images:
                assert left <= start and end <= right + 0.5, (kind, width, (left, right), (start, end))
        assert browser.js("document.documentElement.scrollWidth") <= width
        shot = browser.screenshot(tmp_path / f"{kind}_{width}.png")
        folder = os.environ.get("VIDFORGE_REVIEW_SCREENSHOTS")
        if folder:
            (Path(folder) / f"layout_{kind}_{width}.png").write_bytes(shot)
    finally:
        browser.call(
            "Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False
        )


def test_the_infer_page_shows_the_lora_and_the_input_image(runs, browser) -> None:
    browser.open(runs["infer"].as_uri())
    browser.wait_for("[...document.images].every(i => i.complete)")
    summary = browser.js("document.getElementById('summary').textContent")
    assert "my_lora" in summary
    cards = browser.js(
        f"{CARDS}.map(c => [c.querySelector('dd[data-key=lora]').textContent,"
        " c.querySelector('dd[data-key=lora_scale]').textContent,"
        " c.querySelector('figure.input figcaption').textContent,"
        " c.querySelector('figure.input img').naturalWidth])"
    )
    assert len(cards) == len(PROMPTS)
    for lora, scale, label, width in cards:
        assert lora.endswith("my_lora") and scale == "0.8" and label == "input image" and width > 0
