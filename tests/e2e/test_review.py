"""`vidforge review` in headless Chromium: a curation run (the real `vidforge caption` on the sample
videos), an infer output and a train run (the smallest training of the train tests, with validation). The
tests read the page back through the browser: every clip and sample is listed with its thumbnail, a click
on a reject reason leaves only those clips, a click on a score's column orders the clips by it (checked
against the manifest), and a 10,000-clip run shows one page at a time.

VIDFORGE_REVIEW_SCREENSHOTS=DIR saves each page kind's screenshot there (docs/ holds the README's)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from browser import Browser  # noqa: E402
from curation_fixtures import SETTINGS, make_clips_dir  # noqa: E402
from train_fixtures import make_latents, train_profile  # noqa: E402

from vidforge.cli.app import app  # noqa: E402
from vidforge.data.manifest import read_jsonl, stable_id, write_jsonl  # noqa: E402

runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"
PROMPTS = ["a red square moving right", "a blue circle"]
ITEMS = "[...document.querySelectorAll('#items .item')]"


def _review(run_dir: Path, *extra: str) -> Path:
    result = runner.invoke(app, ["--json", "review", str(run_dir), *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    page = Path(json.loads(result.output.splitlines()[-1])["page"])
    assert page.is_file()
    return page


def _shot(browser: Browser, tmp_path: Path, name: str) -> None:
    data = browser.screenshot(tmp_path / f"{name}.png")
    assert data[:8] == PNG and len(data) > 10_000
    folder = os.environ.get("VIDFORGE_REVIEW_SCREENSHOTS")
    if folder:
        (Path(folder) / f"review_{name}.png").write_bytes(data)


def _thumbs_loaded(browser: Browser) -> list[bool]:
    browser.wait_for("[...document.images].every(i => i.complete)")
    return browser.js(
        f"{ITEMS}.map(r => {{ const i = r.querySelector('img'); return !!i && i.naturalWidth > 0; }})"
    )


@pytest.fixture(scope="module")
def caption_run(tmp_path_factory, sample_videos, sample_truth) -> Path:
    root = tmp_path_factory.mktemp("review_caption")
    clips = make_clips_dir(root / "clips", sample_videos, sample_truth)
    args = ["--json", "caption", str(clips), "-o", str(root / "captioned")]
    for s in SETTINGS:
        args += ["--set", s]
    assert runner.invoke(app, args, catch_exceptions=False).exit_code == 3  # the corrupt clip
    return root / "captioned"


def test_curation_page_lists_filters_and_sorts_the_clips(caption_run, browser, tmp_path) -> None:
    manifest = read_jsonl(caption_run / "manifest.jsonl")
    browser.open(_review(caption_run).as_uri())
    _shot(browser, tmp_path, "curation")

    rows = browser.js(f"{ITEMS}.map(r => [r.dataset.id, r.dataset.reasons])")
    assert rows == [[r["clip_id"], " ".join(r["reasons"])] for r in manifest]
    decodable = [r["reasons"] != ["error:decode"] for r in manifest]
    assert _thumbs_loaded(browser) == decodable  # a frame strip for every clip that has frames
    assert browser.js("[...document.querySelectorAll('#plots img')].map(i => i.naturalWidth > 0)") == [True]

    # A click on a clip's frames plays the clip itself (loaded only then).
    assert browser.js("document.querySelectorAll('video').length") == 0
    browser.js("document.querySelector('#items .item img').click()")
    browser.wait_for(
        "document.querySelector('#items video') && document.querySelector('#items video').readyState >= 1"
    )
    assert browser.js("document.querySelector('#items video').videoWidth") == manifest[0]["width"]

    # Filter by a reject reason: only the clips rejected for it.
    for reason in ("too_static", "error:decode"):
        browser.click(f'[data-filter="{reason}"]')
        shown = browser.js(f"{ITEMS}.map(r => r.dataset.id)")
        assert shown == [r["clip_id"] for r in manifest if reason in r["reasons"]] and shown
    browser.click('[data-filter="all"]')

    # Filter by a score's range and by source.
    browser.choose("#score-key", "motion")
    browser.choose("#score-min", "0.1")
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == [
        r["clip_id"] for r in manifest if (r.get("motion") or 0) >= 0.1
    ]
    browser.choose("#score-key", "")
    source = manifest[-1]["source"]
    browser.choose("#source", source)
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == [
        r["clip_id"] for r in manifest if r["source"] == source
    ]
    browser.choose("#source", "")
    browser.choose("#search", "SLOWLY")  # captions, ids and sources, whatever the case
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == [
        r["clip_id"] for r in manifest if "slowly" in (r.get("caption") or "")
    ]
    browser.choose("#search", "")

    # Sort by a score: the manifest's clips in that score's order, those without it last; twice: descending.
    measured = [r for r in manifest if r.get("motion") is not None]
    unmeasured = [r["clip_id"] for r in manifest if r.get("motion") is None]
    browser.click('th[data-sort="motion"]')
    ascending = [r["clip_id"] for r in sorted(measured, key=lambda r: r["motion"])]
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == ascending + unmeasured
    browser.click('th[data-sort="motion"]')
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == ascending[::-1] + unmeasured


# Score columns a fuller curation run records besides the three the caption run above measures.
MORE_SCORES = (
    "text_area",
    "texty_frames",
    "watermark",
    "static_ratio",
    "duration_s",
    "sharpness",
    "luma_mean",
)


@pytest.mark.parametrize("width", [1280, 1920])
def test_curation_page_reads_without_a_horizontal_scroll(caption_run, browser, tmp_path, width) -> None:
    """Ten score columns and long captions: the page is no wider than the window (its screenshot is the
    window's width), the decision column is in view, and the clip column holds whole words."""
    run = tmp_path / "wide"
    (run / "clips").mkdir(parents=True)
    records = read_jsonl(caption_run / "manifest.jsonl")
    for i, r in enumerate(records):
        r.update({k: (i + 1) * (j + 1) / 7 for j, k in enumerate(MORE_SCORES)})
        r["caption"] = (
            f"{r.get('caption') or ''} while the camera pans across a wide street full of people at dusk"
        )
        if r.get("media"):
            os.link(caption_run / r["media"], run / r["media"])
    write_jsonl(run / "manifest.jsonl", records)
    browser.call(
        "Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False
    )
    try:
        browser.open(_review(run).as_uri())
        browser.wait_for("[...document.images].every(i => i.complete)")
        shot = browser.screenshot(tmp_path / "page.png")
        assert int.from_bytes(shot[16:20], "big") == width  # PNG's IHDR: the page's full width
        cells = browser.js(
            "[...document.querySelectorAll('#items .item')].map(r => { const c = r.querySelector('td.clip');"
            " const em = parseFloat(getComputedStyle(c).fontSize);"
            " return [r.querySelector('td.decision').getBoundingClientRect().right,"
            " c.getBoundingClientRect().width / em]; })"
        )
        assert len(cells) == len(records)
        assert all(right <= width for right, _ in cells), cells  # the decision, without scrolling
        assert all(ems >= 9 for _, ems in cells), (
            cells
        )  # "motion_static.mp4" on one line, not a letter a line
    finally:
        browser.call(
            "Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False
        )


@pytest.fixture(scope="module")
def train_run(tmp_path_factory) -> Path:
    """4 steps with validation at steps 2 and 4 and checkpoints there, then `infer` from its export."""
    from vidforge.train import loop

    root = tmp_path_factory.mktemp("review_train")
    latents = make_latents(root, samples=2)
    prompts = json.dumps(PROMPTS)
    profile = train_profile(
        "train.steps=4", "train.save_every=2", "train.validate_every=2", f"train.validation_prompts={prompts}"
    )
    loop.run(profile, [latents], root / "run")
    return root / "run"


def test_infer_page_shows_each_sample_with_what_it_came_from(train_run, browser, tmp_path) -> None:
    out = tmp_path / "samples"
    args = ["infer", "-c", str(train_run), "-o", str(out), "--set", "diffusion.guidance=2.5"]
    args += [a for p in PROMPTS for a in ("--prompt", p)]
    assert runner.invoke(app, args, catch_exceptions=False).exit_code == 0
    records = read_jsonl(out / "samples.jsonl")
    assert [(r["sampler"], r["steps"], r["guidance"]) for r in records] == [("heun", 4, 2.5)] * 2
    assert {r["checkpoint_step"] for r in records} == {4}  # the run's last step, where it exported
    assert json.loads((train_run / "export" / "config.json").read_text())["step"] == 4

    browser.open(_review(out).as_uri())
    _shot(browser, tmp_path, "infer")
    cards = browser.js(
        f"{ITEMS}.map(c => [c.querySelector('.caption').textContent,"
        " Object.fromEntries([...c.querySelectorAll('dd')].map(d => [d.dataset.key, d.textContent]))])"
    )
    assert [c[0] for c in cards] == PROMPTS
    for (_, meta), record in zip(cards, records, strict=True):
        assert meta["seed"] == str(record["seed"]) and meta["sampler"] == "heun"
        assert meta["steps"] == "4" and meta["guidance"] == "2.5" and meta["checkpoint_step"] == "4"
    assert _thumbs_loaded(browser) == [True, True]


def test_train_page_shows_the_curves_and_validation_samples(train_run, browser, tmp_path) -> None:
    browser.open(_review(train_run).as_uri())
    _shot(browser, tmp_path, "train")
    browser.wait_for("[...document.images].every(i => i.complete)")
    plots = browser.js(
        "[...document.querySelectorAll('#plots figure')].map(f => [f.textContent, f.querySelector('img').naturalWidth > 0])"
    )
    titles = [t for t, ok in plots if ok]
    assert len(titles) == len(plots)
    for wanted in (
        "loss",
        "loss per noise level",
        "learning rate",
        "gradient norm",
        "step time",
        "model FLOP",
    ):
        assert any(t.startswith(wanted) for t in titles), (wanted, titles)
    groups = browser.js("[...document.querySelectorAll('#items h2.group')].map(h => h.textContent)")
    assert groups == ["step 4", "step 2"]
    captions = browser.js(f"{ITEMS}.map(c => c.querySelector('.caption').textContent)")
    assert sorted(captions) == sorted(PROMPTS * 2)
    assert all(_thumbs_loaded(browser))
    browser.click('[data-group="step 2"]')
    assert browser.js(f"{ITEMS}.length") == len(PROMPTS)


def test_a_10000_clip_run_is_shown_a_page_at_a_time(caption_run, browser, tmp_path) -> None:
    """10,000 records (sharing one clip file: the thumbnails are the slow part and are cached per item)."""
    run = tmp_path / "big"
    (run / "clips").mkdir(parents=True)
    first = read_jsonl(caption_run / "manifest.jsonl")[0]
    records = []
    for i in range(10_000):
        keep = i % 3 != 0
        records.append(
            {
                **first,
                "clip_id": stable_id("big", i),
                "motion": (i * 7919 % 10_000) / 1000,
                "keep": keep,
                "reasons": [] if keep else ["too_static"],
                "media": f"clips/{i}.mp4" if i < 3 else None,
            }
        )
    for i in range(3):
        os.link(caption_run / first["media"], run / "clips" / f"{i}.mp4")
    write_jsonl(run / "manifest.jsonl", records)
    browser.open(_review(run).as_uri())
    assert browser.js(f"{ITEMS}.length") == 50
    assert browser.js("document.querySelector('.showing').textContent").startswith("1–50 of 10000")
    browser.click(".next")
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == [r["clip_id"] for r in records[50:100]]
    browser.click('th[data-sort="motion"]')
    lowest = sorted(records, key=lambda r: r["motion"])[:50]
    assert browser.js(f"{ITEMS}.map(r => r.dataset.id)") == [r["clip_id"] for r in lowest]
    browser.click('[data-filter="too_static"]')
    assert browser.js("document.querySelector('.showing').textContent").startswith("1–50 of 3334")


def test_review_refuses_what_is_not_a_run(tmp_path) -> None:
    for target, words in ((tmp_path / "nope", "no such directory"), (tmp_path, "not a run to review")):
        result = runner.invoke(app, ["review", str(target)])
        assert result.exit_code == 2 and words in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_media_outside_the_run_dir_is_not_linked(caption_run, tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    first = read_jsonl(caption_run / "manifest.jsonl")[0]
    outside = os.path.relpath(caption_run / first["media"], run)  # ../../...: a real clip, elsewhere
    write_jsonl(run / "manifest.jsonl", [{**first, "media": outside}])
    text = _review(run).read_text()
    data = json.loads(text.split('<script id="data" type="application/json">')[1].split("</script>")[0])
    assert data["items"][0]["media"] is None and data["items"][0]["thumb"] is None
    assert any("outside" in note for note in data["notes"])


HOSTILE_TEXT = [
    "<!--<script>",  # the reported one: the parser's double-escaped state swallowed the page's script
    "</script><script>document.title='owned'</script>",
    "<!-- a comment that never ends",
    "-->",
    "<script>",
    "a & b &amp; <b>bold</b> ]]> <![CDATA[",
    "\u2028\u2029 line separators",
]


def test_captions_that_play_with_the_html_parser_leave_every_row_shown(tmp_path, browser) -> None:
    """Issue 38, point 3: the page's data escaped "</" only, so a prompt holding "<!--<script>" blanked the
    page (0 rows). Every parser state is held off: each row is shown with its text as written."""
    run = tmp_path / "infer_out"
    run.mkdir()
    records = [{"video": f"s{i}.mp4", "prompt": text, "seed": i} for i, text in enumerate(HOSTILE_TEXT)]
    records.append({"video": "<!--<script>.mp4", "prompt": "a clean one after them", "seed": 99})
    write_jsonl(run / "samples.jsonl", records)
    browser.open(_review(run).as_uri())
    assert browser.js("document.title") != "owned"
    assert browser.js(f"{ITEMS}.length") == len(records)
    shown = browser.js(f"{ITEMS}.map(r => r.querySelector('.caption').textContent)")
    assert shown == [r["prompt"] for r in records]
    assert browser.js("document.querySelectorAll('script').length") == 2  # the data and the page's own


def _page_data(page: Path) -> dict:
    text = page.read_text()
    return json.loads(text.split('<script id="data" type="application/json">')[1].split("</script>")[0])


def test_odd_records_are_shown_as_they_can_be_not_a_raw_error(tmp_path) -> None:
    """Issue 38, point 10: NaN in samples.jsonl, a record without `video`, a line that is not a record and
    a metrics key with `$...$` (matplotlib's mathtext) each ended `review` with a raw error."""
    infer = tmp_path / "infer_out"
    infer.mkdir()
    (infer / "samples.jsonl").write_text(
        '{"video": "a.mp4", "prompt": "p", "guidance": NaN, "seed": 1}\n{"prompt": "no video"}\n[1, 2]\n'
    )
    data = _page_data(_review(infer))
    assert [(i["id"], i["caption"], i["media"]) for i in data["items"]] == [
        ("a", "p", None),
        ("sample 2", "no video", None),
    ]
    assert data["items"][0]["meta"]["guidance"] is None
    assert data["notes"][0] == "1 line(s) of samples.jsonl are not records: not shown"

    train = tmp_path / "train_run"
    train.mkdir()
    write_jsonl(
        train / "metrics.jsonl",
        [{"step": s, "loss_sigma_0.1": 1.0 / s, "loss_sigma_$\\frac$": 2.0 / s} for s in (1, 2)],
    )
    data = _page_data(_review(train))
    assert [p["title"] for p in data["plots"]] == ["loss per noise level (sigma)"]
