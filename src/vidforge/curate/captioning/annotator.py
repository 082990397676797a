"""What `vidforge caption` does to each clip: caption it (coca | endpoint | sidecar), clean the caption,
then run every enabled curation filter (`curate.filters`: aesthetic, on-screen text, watermark, motion,
caption-video match, each a scorer) and decide keep/reject. `CaptionAnnotator` loads its models once,
after `caption_checks.check_inputs` has refused, in about a second, whatever it can see is wrong in the
user's input. Imports no torch at module level (the caption stages' decode workers import this module)."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate import filters
from vidforge.curate.captioning.captioners import ClipItem, build_captioner
from vidforge.curate.captioning.captioners.cleaning import clean_caption
from vidforge.curate.decision import decide
from vidforge.curate.filters import Clip, Resources
from vidforge.data.paths import inside, plain_name
from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption

log = logging.getLogger(__name__)

STAGE = "caption"
TEXT_EMBEDDING = "_text_embedding"
"""A row's private key: its caption's CLIP text vector, for the caption output's embedding store (the
caption run takes it off the row before the ledger: vectors are not JSON)."""
CAPTION_STEPS = ("decode", "caption", "enhance")
CAPTION_FIELDS = ("caption", "caption_source", "caption_flags")


def steps() -> tuple[str, ...]:
    """Every step of a clip's annotation, in order: decoding, the caption, then each scorer."""
    return CAPTION_STEPS + filters.names()


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


def blank_row(record: dict[str, Any]) -> dict[str, Any]:
    """A clip's record with every annotation unset (what a failed step leaves)."""
    row = dict(record)
    row.update({k: ([] if k == "caption_flags" else None) for k in CAPTION_FIELDS + filters.fields()})
    return row


def caption_clip_embedder(cfg: Caption, device: str):
    """`curation.caption.clip`'s model, set up (`curate.scorers.clip_score.ClipEmbedder`): the one the aesthetic
    and clip_score filters read and whose text tower embeds the captions. Random weights (where allowed)
    come from their own seed, so `vidforge search --captions` builds the same text tower as the run."""
    import torch

    from vidforge.curate.scorers.clip_score import ClipEmbedder

    embedder = ClipEmbedder(cfg.clip, device=device, random_weights=cfg.random_weights)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        embedder.setup()
    return embedder


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
            for s in steps()
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
        from vidforge.curate.captioning.checks import check_inputs

        cfg = self.cfg
        check_inputs(cfg, [])  # every check on the user's input, before any model loads
        import torch

        from vidforge.device import select_device

        self.device = str(select_device(cfg.device, "curation.caption.device"))
        # Random weights (tests, demos) are the same in every worker and every run: seeded, without
        # touching the caller's random state.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self._load_models(cfg)
        self._ready = True

    def _load_models(self, cfg: Caption) -> None:
        import torch

        self.captioner = build_captioner(cfg, device=self.device, random_weights=cfg.random_weights)
        self.captioner.setup()
        self.embedder = self.enhancer = None
        if cfg.enhance.enabled:
            from vidforge.curate.captioning.captioners.enhance import CaptionEnhancer

            self.enhancer = CaptionEnhancer(cfg.enhance)
            self.enhancer.setup()
        self.scorers = filters.enabled(cfg)
        if any(s.uses_clip for s in self.scorers):
            self.embedder = caption_clip_embedder(cfg, self.device)
        resources = Resources(self.device, cfg.random_weights, self.embedder)
        for scorer in self.scorers:
            # Each scorer's random weights from its own seed: turning another filter on or off (or
            # registering a new one) leaves them as they were.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                scorer.setup(resources)
        parts = [("caption", self.captioner), ("clip", self.embedder)] + [(s.name, s) for s in self.scorers]
        self.random_weights += [label for label, part in parts if getattr(part, "random_weights", False)]

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

        # CLIP image embeddings and the caption's text embedding, shared by the scorers that use them (its
        # cost split between them); the text vector also goes to the output's embedding store.
        embeddings: dict[int, np.ndarray] = {}
        texts: dict[int, np.ndarray] = {}
        users = [s.name for s in self.scorers if s.uses_clip]
        if self.embedder is not None:
            t0 = time.perf_counter()
            readers = [s.name for s in self.scorers if s.reads_text]
            for i in live:
                try:
                    embeddings[i] = self.embedder.encode_images(items[i].sample(cfg.clip.frames))
                except Exception as err:  # noqa: BLE001
                    for step in users:
                        failed[i][step] = f"{type(err).__name__}: {err}"
                if i not in embeddings or not out[i]["caption"]:
                    continue
                try:  # one caption a forward pass: a vector must not depend on its batch's other clips
                    texts[i] = self.embedder.encode_texts([out[i]["caption"]])[0]
                    out[i][TEXT_EMBEDDING] = texts[i]
                except Exception as err:  # noqa: BLE001
                    log.warning("%s: caption text embedding failed: %s", clip_id_of(out[i]), err)
                    for step in readers:
                        failed[i][step] = f"{type(err).__name__}: {err}"
            spent = time.perf_counter() - t0
            for step in users:
                self.timings.add(step, spent / len(users), 0)
        for scorer in self.scorers:
            self._score(scorer, items, out, live, failed, embeddings, texts)

        done = []
        order = steps()
        for row, fails in zip(out, failed, strict=True):
            reasons = decide(row, cfg, failed=[s for s in order if s in fails])
            row.update(keep=not reasons, reasons=reasons, random_weights=bool(self.random_weights))
            errs = [
                {"clip_id": clip_id_of(row), "stage": STAGE, "step": s, "reason": fails[s]}
                for s in order
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

    def _score(self, scorer, items, out, live, failed, embeddings, texts) -> None:
        """One scorer over the batch's clips that decoded and have not failed it yet; a clip it raises on
        (or the whole call raising) is an error of that clip."""
        t0 = time.perf_counter()
        todo = [i for i in live if scorer.name not in failed[i]]
        clips = [
            Clip(items[i], out[i], embeddings.get(i), texts.get(i))
            if scorer.uses_clip
            else Clip(items[i], out[i])
            for i in todo
        ]
        try:
            results = scorer.score(clips) if clips else []
        except Exception as err:  # noqa: BLE001 - recorded for every clip of the call
            results = [err] * len(clips)
        for i, res in zip(todo, results, strict=True):
            if isinstance(res, Exception):
                failed[i][scorer.name] = f"{type(res).__name__}: {res}"
            else:
                out[i].update(res)
        self.timings.add(scorer.name, time.perf_counter() - t0, len(live))
