"""`vidforge caption`: caption every clip of a `vidforge clip` output and annotate its quality.

Per clip: decode the frames every annotation asks for (once), caption (coca | endpoint | sidecar), clean
the caption, then score aesthetics (LAION head on CLIP embeddings), on-screen text (EasyOCR + Vchitect's
rule), motion (Farneback flow) and caption-video match (CLIP similarity), and decide keep/reject.

Output (OUT): `manifest.jsonl` (every input field plus the annotations, `keep`, `reasons`, `media`),
`rejected.jsonl` (id, media, reasons), `errors.jsonl`, `summary.json`, `histograms.png`, and `clips/`
with each clip hard-linked (copied across filesystems) so OUT stands alone. Each clip is one unit of
`data.units.UnitLedger`: a rerun skips finished clips, and a killed run resumes where it stopped.

`run` drives the clips through the curate executors (`local`: a decode process pool feeding one
model-holding thread; `ray`: the same stages as actors), see `caption_stages`. `CaptionAnnotator` does the
annotation of a batch; it loads its models once, after `caption_checks.check_inputs` has refused, in
about a second, whatever would fail on the user's input. The output files do not depend on completion
order: the ledger orders them by clip id. `retry_errors` redoes clips committed with errors."""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate.captioners import ClipItem, build_captioner
from vidforge.curate.captioners.cleaning import clean_caption
from vidforge.curate.decision import REASONS, decide
from vidforge.data.manifest import TMP_MARK, read_jsonl, write_json, write_jsonl
from vidforge.data.paths import UnsafePath, inside, plain_name
from vidforge.data.units import ERRORS, MANIFEST, UnitLedger
from vidforge.errors import UserInputError

log = logging.getLogger(__name__)

STAGE = "caption"
REJECTED = "rejected.jsonl"
SUMMARY = "summary.json"
HISTOGRAMS = "histograms.png"
STEPS = ("decode", "caption", "aesthetic", "ocr", "motion", "clip_score")


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


def decode_frames(path: Path, wanted: Callable[[int], set[int]]) -> tuple[int, dict[int, np.ndarray]]:
    """The frame count of a clip and its frames at `wanted(count)` as RGB uint8, decoding it once."""
    import av
    from av.video.reformatter import VideoReformatter

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        count = stream.frames
        if count <= 0:  # no count in the header: count by decoding (clips are short)
            count = sum(1 for _ in container.decode(stream))
            container.seek(0)
        keep = wanted(count)
        frames: dict[int, np.ndarray] = {}
        last = max(keep, default=-1)
        to_rgb = VideoReformatter()  # one swscale context, not one per frame
        for i, frame in enumerate(container.decode(stream)):
            if i in keep:
                frames[i] = to_rgb.reformat(frame, format="rgb24").to_ndarray()
            if i >= last:
                break
    if set(frames) != keep:  # the header over-counted: fall back to what was decoded
        missing = keep - set(frames)
        if not frames:
            raise ValueError(f"no decodable frames in {path.name}")
        count = max(frames) + 1
        log.debug("%s: %d wanted frames beyond the end", path.name, len(missing))
        frames = {i: f for i, f in frames.items() if i < count}
    return count, frames


ANNOTATIONS = (
    "caption",
    "caption_source",
    "caption_flags",
    "aesthetic",
    "text_area",
    "texty_frames",
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
    """Records of clips -> annotated records (and per-clip errors). Stage-shaped: `setup` once (fails fast
    on a missing model), `process_batch` per batch."""

    name = STAGE
    kind = "thread"
    workers = 1

    def __init__(self, cfg: Any, clips_dir: str | os.PathLike):
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

    def _load_models(self, cfg: Any) -> None:
        self.captioner = build_captioner(cfg, device=self.device, random_weights=cfg.random_weights)
        self.captioner.setup()
        self.embedder = self.aesthetic = self.ocr = None
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
        for label, part in (
            ("caption", self.captioner),
            ("clip", self.embedder),
            ("aesthetic", self.aesthetic),
        ):
            if part is not None and getattr(part, "random_weights", False):
                self.random_weights.append(label)

    def teardown(self) -> None:
        close = getattr(getattr(self, "captioner", None), "close", None)
        if close:
            close()

    # -- frames --------------------------------------------------------------------------------------
    def wanted(self, count: int) -> set[int]:
        from vidforge.curate.caption_stages import wanted_frames

        return wanted_frames(self.cfg, count)

    # -- work ----------------------------------------------------------------------------------------
    def process_batch(
        self, records: list[dict[str, Any]]
    ) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """Each record -> (annotated record, errors), decoding here (the executors decode in their own stage)."""
        from vidforge.curate.caption_stages import decode_record

        decoded = [decode_record(r, self.cfg, self.clips_dir) for r in records]
        for d in decoded:
            self.timings.add("decode", d.seconds, 1)
        return self.annotate(decoded)

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
            cleaned = clean_caption(
                res.text,
                max_chars=cfg.text.max_chars,
                min_words=cfg.text.min_words,
                max_repeats=cfg.text.max_repeats,
                max_token_share=cfg.text.max_token_share,
            )
            out[i]["caption"], out[i]["caption_flags"] = cleaned.text, cleaned.flags
        self.timings.add("caption", time.perf_counter() - t0, len(live))

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

    def _motion(self, row: dict[str, Any], item: ClipItem) -> None:
        from vidforge.curate.motion import motion_score, pair_starts

        pairs = [
            (item.frames[t], item.frames[t + 1]) for t in pair_starts(item.num_frames, self.cfg.motion.pairs)
        ]
        row["motion"] = _finite(motion_score(pairs, self.cfg.motion.size))

    def _clip_score(self, row: dict[str, Any], emb: np.ndarray | None) -> None:
        from vidforge.curate.clip_score import clip_similarity

        if emb is not None and row.get("caption"):
            row["clip_score"] = _finite(clip_similarity(emb, self.embedder.encode_texts([row["caption"]])[0]))


def link_media(src: Path, out_dir: Path, clip_id: str) -> str:
    """Hard-link (else copy) a clip into OUT/clips/ atomically; returns its path relative to OUT."""
    rel = Path("clips") / f"{clip_id}{src.suffix or '.mp4'}"
    target = out_dir / rel
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.stem}{TMP_MARK}{os.getpid()}{target.suffix}")
        tmp.unlink(missing_ok=True)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copy2(src, tmp)
        os.replace(tmp, target)
    return rel.as_posix()


@dataclass
class CaptionSummary:
    clips: int
    kept: int
    rejected: int
    errors: int
    skipped: int
    """Clips already done by an earlier run (resumed)."""
    retried: int
    """Clips an earlier run committed with errors, redone (`--retry-errors`)."""
    by_reason: dict[str, int]
    timings: dict[str, dict[str, float]]
    random_weights: list[str]
    out: str
    wall_seconds: float
    executor: str = "local"
    stages: list[dict[str, Any]] = field(default_factory=list)
    """Per executor stage: items, errors, workers, busy seconds."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_clip_manifest(clips_dir: Path) -> list[dict[str, Any]]:
    path = clips_dir / MANIFEST
    if not path.is_file():
        raise UserInputError(f"{clips_dir}: no {MANIFEST}; give the output folder of `vidforge clip`")
    try:
        return read_jsonl(path)
    except ValueError as err:
        raise UserInputError(str(err)) from None


def run(
    profile: Any,
    clips_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    limit: int | None = None,
    executor: str = "local",
    ray_address: str | None = None,
    retry_errors: bool = False,
    progress: Callable[[int, int], None] | None = None,
    monitor: Callable[[list[Any]], None] | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    annotator: CaptionAnnotator | None = None,
) -> CaptionSummary:
    """Caption and annotate every clip of `clips_dir` (a `vidforge clip` output) into `out`.

    `progress(done, total)` is called after each committed clip, `monitor(stage_stats)` after each batch
    (per-stage progress), `on_start(info)` once the work is known. A clip already committed is skipped,
    unless `retry_errors` and it was committed with errors."""
    from vidforge.curate.caption_checks import check_inputs
    from vidforge.curate.caption_stages import AnnotateStage, DecodeStage
    from vidforge.curate.executors import make_executor

    started = time.perf_counter()
    cfg = profile.curation.caption
    clips_dir, out_dir = Path(clips_dir), Path(out)
    if clips_dir.resolve() == out_dir.resolve():
        raise UserInputError("-o/--out must differ from CLIPS_DIR")
    if executor not in ("local", "ray"):
        raise UserInputError(f"--executor {executor!r}: use local or ray")
    records = read_clip_manifest(clips_dir)
    if limit is not None:
        records = records[:limit]
    ledger = UnitLedger(out_dir)
    ledger.recover()
    errored = {e["unit"] for e in ledger.entries() if e["kind"] == "error"} if retry_errors else set()
    todo: dict[str, dict[str, Any]] = {}
    for r in records:
        cid = clip_id_of(r)
        if cid not in todo and (cid in errored or not ledger.is_done(cid)):
            try:  # refused here: a path from the manifest must name a file inside CLIPS_DIR (and OUT)
                media_of(r, clips_dir)
            except UnsafePath as err:
                ledger.commit(
                    cid, [], [{"clip_id": cid, "stage": STAGE, "step": "input", "reason": str(err)}]
                )
                continue
            todo[cid] = r
    if todo:
        check_inputs(cfg, todo.values())  # fail fast: before any worker starts or model loads
    total = len({clip_id_of(r) for r in records})
    done = total - len(todo)
    timings, random_weights = Timings(), set()
    if on_start is not None:
        on_start(
            {
                "clips": total,
                "todo": len(todo),
                "retried": len(errored & set(todo)),
                "stages": ["decode", "annotate"],
                "executor": executor,
            }
        )
    if progress:
        progress(done, total)

    def commit(cid: str, items: list[Any], errors: list[dict[str, Any]]) -> None:
        nonlocal done
        if items:
            [item] = items
            row, errs = item.row, item.errors
            for step, (seconds, clips) in item.timings.items():
                timings.add(step, seconds, clips)
            random_weights.update(item.random_weights)
        else:  # a stage raised or its worker died: this clip's error; the batch goes on
            row, errs = blank_row(todo[cid]), []
            for e in errors or [{"stage": "annotate", "reason": "no result"}]:
                errs.append({"clip_id": cid, "stage": STAGE, "step": e["stage"], "reason": e["reason"]})
            reasons = decide(row, cfg, failed=[e["step"] for e in errs])
            row.update(keep=False, reasons=reasons, random_weights=cfg.random_weights)
        src = media_of(row, clips_dir)
        if src.is_file():
            row["media"] = link_media(src, out_dir, cid)
        ledger.commit(cid, [row], errs)
        done += 1
        if progress:
            progress(done, total)

    stats = None
    if todo:
        options: dict[str, Any] = {"queue_depth": profile.curation.queue_depth}
        if executor == "ray":
            options["address"] = ray_address
        stages = [
            DecodeStage(cfg, clips_dir, workers=cfg.decode_workers),
            AnnotateStage(cfg, clips_dir, load_models=executor == "local", annotator=annotator),
        ]
        stats = make_executor(executor, **options).run(stages, iter(todo.items()), commit, monitor)
    manifest, errors = ledger.finalize()
    wanted = {clip_id_of(r) for r in records}
    manifest = [r for r in manifest if clip_id_of(r) in wanted]
    rejected = [
        {"clip_id": clip_id_of(r), "media": r.get("media"), "reasons": r["reasons"]}
        for r in manifest
        if not r["keep"]
    ]
    write_jsonl(out_dir / REJECTED, rejected)
    by_reason = Counter(reason for r in manifest for reason in r["reasons"])
    ordered = {k: by_reason.get(k, 0) for k in REASONS}
    ordered.update({k: v for k, v in sorted(by_reason.items()) if k not in ordered})
    summary = CaptionSummary(
        clips=len(manifest),
        kept=sum(bool(r["keep"]) for r in manifest),
        rejected=len(rejected),
        errors=len(errors),
        skipped=total - len(todo),
        retried=len(errored & set(todo)),
        by_reason=ordered,
        timings=timings.table(),
        random_weights=[k for k in ("caption", "clip", "aesthetic") if k in random_weights],
        out=str(out_dir),
        wall_seconds=round(time.perf_counter() - started, 3),
        executor=executor,
        stages=[s.summary() for s in (stats.stages if stats else [])],
    )
    from vidforge.curate.histograms import thresholds, write_histograms

    # The thresholds the run decided by, so that `vidforge review` marks those on its histograms.
    write_json(
        out_dir / SUMMARY,
        {
            **summary.as_dict(),
            "backend": cfg.backend,
            "thresholds": thresholds(cfg),
            "motion_size": cfg.motion.size,
        },
    )

    write_histograms(manifest, cfg, out_dir / HISTOGRAMS)
    return summary


__all__ = ["ERRORS", "MANIFEST", "CaptionAnnotator", "CaptionSummary", "run"]
