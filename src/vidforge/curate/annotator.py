"""What `vidforge caption` does to each clip: caption it (coca | endpoint | sidecar), clean the caption,
score aesthetics (LAION head on CLIP embeddings), on-screen text (EasyOCR + Vchitect's rule), motion
(Farneback flow) and caption-video match (CLIP similarity), and decide keep/reject. `CaptionAnnotator`
loads its models once, after `caption_checks.check_inputs` has refused, in about a second, whatever would
fail on the user's input. Imports no torch at module level (the caption stages' decode workers import
this module)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate.captioners import ClipItem, build_captioner
from vidforge.curate.captioners.cleaning import clean_caption
from vidforge.curate.decision import decide
from vidforge.data.paths import inside, plain_name
from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption

log = logging.getLogger(__name__)

STAGE = "caption"
STEPS = ("decode", "caption", "enhance", "aesthetic", "ocr", "watermark", "motion", "clip_score")


def clip_id_of(record: dict[str, Any]) -> str:
    for key in ("clip_id", "id", "key"):
        if record.get(key):
            return str(record[key])
    raise UserInputError(f"clip manifest record without clip_id: {sorted(record)[:8]}")


def media_of(record: dict[str, Any], clips_dir: Path) -> Path:
    """The clip file of a record: its `media`/`path` field (relative to the clips dir), else clips/<id>.mp4.
    `UnsafePath` when that file (or the clip id, a file name in OUT) is not inside its folder."""
    plain_name(clip_id_of(record), "clip_id")
    for key in ("media", "path", "file"):
        value = record.get(key)
        if value:
            return inside(clips_dir, value, key)
    return inside(clips_dir, f"clips/{clip_id_of(record)}.mp4", "clip_id")


ANNOTATIONS = (
    "caption",
    "caption_source",
    "caption_flags",
    "aesthetic",
    "text_area",
    "texty_frames",
    "watermark",
    "motion",
    "clip_score",
)


def blank_row(record: dict[str, Any]) -> dict[str, Any]:
    """A clip's record with every annotation unset (what a failed step leaves)."""
    row = dict(record)
    row.update({k: ([] if k == "caption_flags" else None) for k in ANNOTATIONS})
    return row


def _finite(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


@dataclass
class Timings:
    seconds: Counter = field(default_factory=Counter)
    clips: Counter = field(default_factory=Counter)

    def add(self, step: str, seconds: float, clips: int) -> None:
        self.seconds[step] += seconds
        self.clips[step] += clips

    def table(self) -> dict[str, dict[str, float]]:
        return {
            s: {
                "seconds": round(self.seconds[s], 4),
                "clips": self.clips[s],
                "clips_per_s": round(self.clips[s] / self.seconds[s], 3) if self.seconds[s] else None,
            }
            for s in STEPS
            if self.clips[s]
        }


class CaptionAnnotator:
    """Decoded clips -> annotated records (and per-clip errors): `setup` once (fails fast on a missing
    model), then `annotate` per batch (`caption_stages.AnnotateStage` drives it)."""

    name = STAGE
    kind = "thread"
    workers = 1

    def __init__(self, cfg: Caption, clips_dir: str | os.PathLike):
        self.cfg = cfg
        self.clips_dir = Path(clips_dir)
        self.batch_size = cfg.batch_clips
        self.timings = Timings()
        self.random_weights: list[str] = []
        self._ready = False

    # -- setup ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        if self._ready:
            return
        from vidforge.curate.caption_checks import check_inputs

        cfg = self.cfg
        check_inputs(cfg, [])  # every check on the user's input, before any model loads
        import torch

        from vidforge.curate.clip_score import resolve_device

        self.device = resolve_device(cfg.device)
        # Random weights (tests, demos) are the same in every worker and every run: seeded, without
        # touching the caller's random state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self._load_models(cfg)
        self._ready = True

    def _load_models(self, cfg: Caption) -> None:
        self.captioner = build_captioner(cfg, device=self.device, random_weights=cfg.random_weights)
        self.captioner.setup()
        self.embedder = self.aesthetic = self.ocr = self.enhancer = None
        if cfg.enhance.enabled:
            from vidforge.curate.captioners.enhance import CaptionEnhancer

            self.enhancer = CaptionEnhancer(cfg.enhance)
            self.enhancer.setup()
        if cfg.aesthetic.enabled or cfg.clip_score.enabled:
            from vidforge.curate.clip_score import ClipEmbedder

            self.embedder = ClipEmbedder(cfg.clip, device=self.device, random_weights=cfg.random_weights)
            self.embedder.setup()
        if cfg.aesthetic.enabled:
            from vidforge.curate.aesthetic import AestheticScorer

            self.aesthetic = AestheticScorer(
                cfg.aesthetic.head, device=self.device, random_weights=cfg.random_weights
            )
            self.aesthetic.setup(embedding_width=self.embedder.width)
        if cfg.ocr.enabled:
            from vidforge.curate.ocr import EasyOcrDetector, TextRule

            self.ocr = EasyOcrDetector(cfg.ocr.model_dir, cfg.ocr.languages, device=self.device)
            self.ocr.setup()
            self.text_rule = TextRule.from_settings(cfg.ocr)
        self.flow = None
        if cfg.motion.enabled and cfg.motion.method != "farneback":
            from vidforge.curate.motion import RaftFlow

            self.flow = RaftFlow(cfg.motion.method, cfg.motion.raft_weights, device=self.device)
            self.flow.setup()
        self.watermark = None
        if cfg.watermark.enabled:
            from vidforge.curate.watermark import WatermarkClassifier

            self.watermark = WatermarkClassifier(
                cfg.watermark, device=self.device, random_weights=cfg.random_weights
            )
            self.watermark.setup()
        for label, part in (
            ("caption", self.captioner),
            ("clip", self.embedder),
            ("aesthetic", self.aesthetic),
            ("watermark", self.watermark),
        ):
            if part is not None and getattr(part, "random_weights", False):
                self.random_weights.append(label)

    def teardown(self) -> None:
        for part in ("captioner", "enhancer"):
            close = getattr(getattr(self, part, None), "close", None)
            if close:
                close()

    # -- work ----------------------------------------------------------------------------------------
    def annotate(self, decoded: list[Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Each `caption_stages.Decoded` -> (annotated record, errors). A step that fails on a clip is an
        error of that clip (a clip that did not decode is one too); the other clips go on."""
        self.setup()
        cfg = self.cfg
        items: list[ClipItem | None] = []
        out: list[dict[str, Any]] = []
        failed: list[dict[str, str]] = []  # per clip: step -> reason
        for d in decoded:
            rec = d.record
            row = blank_row(rec)
            out.append(row)
            failed.append({})
            if d.error is None:
                items.append(ClipItem(clip_id_of(rec), rec, d.num_frames, d.frames))
            else:
                failed[-1]["decode"] = d.error
                items.append(None)
        live = [i for i, it in enumerate(items) if it is not None]

        # Captions, batched across clips (the captioner isolates per-clip failures itself).
        t0 = time.perf_counter()
        try:
            results = self.captioner.caption([items[i] for i in live])
        except Exception as err:  # noqa: BLE001
            results = [None] * len(live)
            for i in live:
                failed[i]["caption"] = f"{type(err).__name__}: {err}"
        for i, res in zip(live, results, strict=True):
            if res is None:
                continue
            out[i]["caption_source"] = res.source
            if res.error is not None:
                failed[i]["caption"] = res.error
                continue
            out[i]["caption"], out[i]["caption_flags"] = self._clean(res.text)
        self.timings.add("caption", time.perf_counter() - t0, len(live))
        if self.enhancer is not None:
            self._enhance(out, live, failed)

        # CLIP image embeddings, shared by the aesthetic score and the caption match.
        embeddings: dict[int, np.ndarray] = {}
        if self.embedder is not None:
            t0 = time.perf_counter()
            for i in live:
                try:
                    embeddings[i] = self.embedder.encode_images(items[i].sample(cfg.clip.frames))
                except Exception as err:  # noqa: BLE001
                    for step in ("aesthetic", "clip_score"):
                        failed[i][step] = f"{type(err).__name__}: {err}"
            spent = time.perf_counter() - t0
            share = [
                s
                for s, on in (("aesthetic", cfg.aesthetic.enabled), ("clip_score", cfg.clip_score.enabled))
                if on
            ]
            for step in share:  # the embedding cost is split between the steps that use it
                self.timings.add(step, spent / len(share), 0)
        self._step(
            "aesthetic",
            live,
            failed,
            lambda i: self._aesthetic(out[i], embeddings.get(i)),
            enabled=self.aesthetic is not None,
        )
        self._step("ocr", live, failed, lambda i: self._ocr(out[i], items[i]), enabled=self.ocr is not None)
        self._step(
            "watermark",
            live,
            failed,
            lambda i: self._watermark(out[i], items[i]),
            enabled=self.watermark is not None,
        )
        self._step(
            "motion", live, failed, lambda i: self._motion(out[i], items[i]), enabled=cfg.motion.enabled
        )
        self._step(
            "clip_score",
            live,
            failed,
            lambda i: self._clip_score(out[i], embeddings.get(i)),
            enabled=self.embedder is not None and cfg.clip_score.enabled,
        )

        done = []
        for row, fails in zip(out, failed, strict=True):
            reasons = decide(row, cfg, failed=[s for s in STEPS if s in fails])
            row.update(keep=not reasons, reasons=reasons, random_weights=bool(self.random_weights))
            errs = [
                {"clip_id": clip_id_of(row), "stage": STAGE, "step": s, "reason": fails[s]}
                for s in STEPS
                if s in fails
            ]
            done.append((row, errs))
        return done

    def _clean(self, text: str | None) -> tuple[str | None, list[str]]:
        t = self.cfg.text
        cleaned = clean_caption(
            text,
            max_chars=t.max_chars,
            min_words=t.min_words,
            max_repeats=t.max_repeats,
            max_token_share=t.max_token_share,
        )
        return cleaned.text, cleaned.flags

    def _enhance(self, out: list[dict[str, Any]], live: list[int], failed: list[dict[str, str]]) -> None:
        """The second caption pass: each clean caption rewritten (then cleaned like any caption), the first
        kept as `caption_original`. Empty or degenerate captions are not sent (nothing to keep facts of);
        a rewrite that fails rejects the clip (`error:enhance`) rather than leave captions of two styles."""
        t0 = time.perf_counter()
        for row in out:
            row.update(caption_original=row.get("caption"), caption_enhanced_by=None)
        todo = [i for i in live if out[i]["caption"] and not out[i]["caption_flags"] and not failed[i]]
        results = self.enhancer.enhance([out[i]["caption"] for i in todo])
        for i, res in zip(todo, results, strict=True):
            if res.error is not None:
                failed[i]["enhance"] = res.error
                continue
            out[i]["caption"], out[i]["caption_flags"] = self._clean(res.text)
            out[i]["caption_enhanced_by"] = res.source
        self.timings.add("enhance", time.perf_counter() - t0, len(todo))

    def _step(self, step: str, live: list[int], failed: list[dict[str, str]], fn, *, enabled: bool) -> None:
        if not enabled:
            return
        t0 = time.perf_counter()
        for i in live:
            if step in failed[i]:
                continue
            try:
                fn(i)
            except Exception as err:  # noqa: BLE001 - recorded for this clip
                failed[i][step] = f"{type(err).__name__}: {err}"
        self.timings.add(step, time.perf_counter() - t0, len(live))

    def _aesthetic(self, row: dict[str, Any], emb: np.ndarray | None) -> None:
        if emb is not None:
            row["aesthetic"] = _finite(self.aesthetic.score_clip(emb))

    def _ocr(self, row: dict[str, Any], item: ClipItem) -> None:
        from vidforge.curate.ocr import judge_text

        frames = item.sample(self.cfg.ocr.frames)
        verdict = judge_text(self.ocr.detect_many(frames), [f.shape[:2] for f in frames], self.text_rule)
        row["text_area"], row["texty_frames"] = round(verdict.text_area, 6), verdict.texty_frames

    def _watermark(self, row: dict[str, Any], item: ClipItem) -> None:
        row["watermark"] = round(self.watermark.score_clip(item.sample(self.cfg.watermark.frames)), 6)

    def _motion(self, row: dict[str, Any], item: ClipItem) -> None:
        from vidforge.curate.motion import motion_score, pair_starts

        pairs = [
            (item.frames[t], item.frames[t + 1]) for t in pair_starts(item.num_frames, self.cfg.motion.pairs)
        ]
        row["motion"] = _finite(motion_score(pairs, self.cfg.motion.size, self.flow))

    def _clip_score(self, row: dict[str, Any], emb: np.ndarray | None) -> None:
        from vidforge.curate.clip_score import clip_similarity

        if emb is not None and row.get("caption"):
            row["clip_score"] = _finite(clip_similarity(emb, self.embedder.encode_texts([row["caption"]])[0]))
