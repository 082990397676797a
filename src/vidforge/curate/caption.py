"""`vidforge caption`: caption every clip of a `vidforge clip` output and annotate its quality.

Per clip: decode the frames every annotation asks for (once), caption (coca | endpoint | sidecar), clean
the caption, then run every enabled filter (`curate.filters`: aesthetics, on-screen text, watermark,
motion, caption-video match) and decide keep/reject.

Output (OUT): `manifest.jsonl` (every input field plus the annotations, `keep`, `reasons`, `media`),
`rejected.jsonl` (id, media, reasons), `errors.jsonl`, `summary.json`, `histograms.png`, `clips/`
with each clip hard-linked (copied across filesystems) so OUT stands alone, and `embeddings/`: the kept
clips' vectors, aesthetic scores and caption text embeddings (`caption_store`), for `vidforge dedup` and
`vidforge search`. Each clip is one unit of
`data.units.UnitLedger`: a rerun skips finished clips, and a killed run resumes where it stopped.

`run` drives the clips through the curate executors (`local`: a decode process pool feeding one
model-holding thread; `ray`: the same stages as actors), see `caption_stages`. `CaptionAnnotator` does the
annotation of a batch (`annotator`); it loads its models once, after `caption_checks.check_inputs` has
refused, in about a second, what it can see is wrong in the user's input. The output files do not depend on completion
order: the ledger orders them by clip id. `retry_errors` redoes clips committed with errors."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidforge.curate import filters
from vidforge.curate.captioning.annotator import (
    STAGE,
    TEXT_EMBEDDING,
    CaptionAnnotator,
    Timings,
    blank_row,
    clip_id_of,
    media_of,
)
from vidforge.curate.captioning.checks import check_inputs
from vidforge.curate.captioning.stages import Annotated, AnnotateStage, DecodeStage
from vidforge.curate.captioning.store import TextLog, write_caption_store
from vidforge.curate.clip import CLIPS_DIR
from vidforge.curate.decision import decide, reasons
from vidforge.data.folder_lock import subfolder
from vidforge.data.manifest import TMP_MARK, read_jsonl, write_json, write_jsonl
from vidforge.data.paths import UnsafePath
from vidforge.data.units import ERRORS, MANIFEST, UnitLedger
from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.profile.caption import Caption

log = logging.getLogger(__name__)

REJECTED = "rejected.jsonl"
SUMMARY = "summary.json"
HISTOGRAMS = "histograms.png"


def link_media(src: Path, out_dir: Path, clip_id: str) -> str:
    """Hard-link (else copy) a clip into OUT/clips/ atomically; returns its path relative to OUT. It keeps
    the clip stage's name (source name and index beside the id) when that name carries the id."""
    name = src.name if src.stem.endswith(clip_id) else f"{clip_id}{src.suffix or '.mp4'}"
    rel = Path(CLIPS_DIR) / name
    target = subfolder(out_dir, CLIPS_DIR) / name
    if not target.exists():
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
        records = read_jsonl(path)
    except ValueError as err:
        raise UserInputError(str(err)) from None
    for number, record in enumerate(records, 1):  # blank lines are skipped: a count, not a line number
        if not isinstance(record, dict):
            raise UserInputError(
                f"{path}: record {number} is a JSON {type(record).__name__}, not an object; each line of a "
                'clip manifest is one clip\'s record ({"clip_id": ..., "media": ...})'
            )
    return records


def pending(
    records: list[dict[str, Any]], clips_dir: Path, ledger: UnitLedger, retry_errors: bool
) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The clips still to caption, by id (a clip the ledger has is skipped unless `retry_errors` and it was
    committed with errors), and the ids of the errored ones. A clip whose media path leaves CLIPS_DIR is
    committed here as an error and not returned."""
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
    return todo, errored


@dataclass
class Committer:
    """The executor's unit callback: one annotated clip (or its error) into the ledger, its media linked
    into OUT and its caption's text embedding logged first (a committed clip has it); counts the run's
    timings and random-weight models as it goes."""

    cfg: Caption
    clips_dir: Path
    out_dir: Path
    ledger: UnitLedger
    todo: dict[str, dict[str, Any]]
    text_log: TextLog
    done: int
    total: int
    progress: Callable[[int, int], None] | None = None
    timings: Timings = field(default_factory=Timings)
    random_weights: set[str] = field(default_factory=set)

    def __call__(self, cid: str, items: list[Annotated], errors: list[dict[str, Any]]) -> None:
        if items:
            [item] = items
            row, errs = item.row, item.errors
            for step, (seconds, clips) in item.timings.items():
                self.timings.add(step, seconds, clips)
            self.random_weights.update(item.random_weights)
        else:  # a stage raised or its worker died: this clip's error; the batch goes on
            row, errs = blank_row(self.todo[cid]), []
            for e in errors or [{"stage": "annotate", "reason": "no result"}]:
                errs.append({"clip_id": cid, "stage": STAGE, "step": e["stage"], "reason": e["reason"]})
            rejected_for = decide(row, self.cfg, failed=[e["step"] for e in errs])
            row.update(keep=False, reasons=rejected_for, random_weights=self.cfg.random_weights)
        src = media_of(row, self.clips_dir)
        if src.is_file():
            row["media"] = link_media(src, self.out_dir, cid)
        self.text_log.append(cid, row.pop(TEXT_EMBEDDING, None))  # before the commit: a committed clip has it
        self.ledger.commit(cid, [row], errs)
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total)


def run(
    profile: RunProfile,
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
    subfolder(clips_dir, CLIPS_DIR, create=False)  # the clip stage's rule for its own output, here too
    ledger = UnitLedger(out_dir)
    ledger.recover()
    subfolder(out_dir, CLIPS_DIR)
    todo, errored = pending(records, clips_dir, ledger, retry_errors)
    if todo:
        check_inputs(cfg, todo.values())  # fail fast: before any worker starts or model loads
    total = len({clip_id_of(r) for r in records})
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
        progress(total - len(todo), total)
    done = total - len(todo)
    commit = Committer(cfg, clips_dir, out_dir, ledger, todo, TextLog(out_dir), done, total, progress)
    stats = None
    try:
        if todo:
            options: dict[str, Any] = {"queue_depth": profile.curation.queue_depth}
            if executor == "ray":
                options["address"] = ray_address
            stages = [
                DecodeStage(cfg, clips_dir, workers=cfg.decode_workers),
                AnnotateStage(cfg, clips_dir, load_models=executor == "local", annotator=annotator),
            ]
            stats = make_executor(executor, **options).run(stages, iter(todo.items()), commit, monitor)
    finally:
        commit.text_log.close()
    return write_outputs(
        cfg,
        clips_dir,
        ledger,
        records,
        commit,
        skipped=done,
        retried=len(errored & set(todo)),
        executor=executor,
        stages=[s.summary() for s in (stats.stages if stats else [])],
        started=started,
    )


def write_outputs(
    cfg: Caption,
    clips_dir: Path,
    ledger: UnitLedger,
    records: list[dict[str, Any]],
    commit: Committer,
    *,
    skipped: int,
    retried: int,
    executor: str,
    stages: list[dict[str, Any]],
    started: float,
) -> CaptionSummary:
    """OUT's files from the ledger: the manifest (the clips of this CLIPS_DIR, by id), the embedding store,
    rejected.jsonl, summary.json (with the thresholds and titles `vidforge review` draws by) and the
    histograms."""
    from vidforge.curate.histograms import thresholds, titles, write_histograms

    out_dir = commit.out_dir
    manifest, errors = ledger.finalize()
    wanted = {clip_id_of(r) for r in records}
    manifest = [r for r in manifest if clip_id_of(r) in wanted]
    # the ledger holds every clip it ever captioned: a clip since gone from CLIPS_DIR (its video removed)
    # is not shard's to read
    write_jsonl(out_dir / MANIFEST, manifest)
    embeddings = write_caption_store(out_dir, clips_dir, manifest, cfg)
    rejected = [
        {"clip_id": clip_id_of(r), "media": r.get("media"), "reasons": r["reasons"]}
        for r in manifest
        if not r["keep"]
    ]
    write_jsonl(out_dir / REJECTED, rejected)
    by_reason = Counter(reason for r in manifest for reason in r["reasons"])
    ordered = {k: by_reason.get(k, 0) for k in reasons()}
    ordered.update({k: v for k, v in sorted(by_reason.items()) if k not in ordered})
    summary = CaptionSummary(
        clips=len(manifest),
        kept=sum(bool(r["keep"]) for r in manifest),
        rejected=len(rejected),
        errors=len(errors),
        skipped=skipped,
        retried=retried,
        by_reason=ordered,
        timings=commit.timings.table(),
        random_weights=[k for k in ("caption", "clip", *filters.names()) if k in commit.random_weights],
        out=str(out_dir),
        wall_seconds=round(time.perf_counter() - started, 3),
        executor=executor,
        stages=stages,
    )
    write_json(
        out_dir / SUMMARY,
        {
            **summary.as_dict(),
            "backend": cfg.backend if cfg.fallback is None else f"{cfg.backend}+{cfg.fallback}",
            "thresholds": thresholds(cfg),
            "titles": titles(cfg),
            "motion_size": cfg.motion.size,
            "embeddings": embeddings,
        },
    )
    write_histograms(manifest, cfg, out_dir / HISTOGRAMS)
    return summary


__all__ = ["ERRORS", "MANIFEST", "CaptionSummary", "run"]
