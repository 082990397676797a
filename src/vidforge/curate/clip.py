"""`vidforge clip`: raw videos -> clips with a manifest, embeddings, errors and a run summary.

Output directory:
    clips/<clip_id>.mp4   H.264 clips (ids: hash of source, start frame, end frame)
    manifest.jsonl        one record per clip, ordered by (source, start_frame)
    embeddings.npy        float32 (clips, D), row i = manifest line i (`embedding_row`); absent if embed off
    embeddings/           the same vectors as column shards, one a source, written as sources finish, with
                          clip ids and durations (`vidforge.data.embeddings`: what `dedup` and `search` read)
    errors.jsonl          sources or clips that failed: {source, stage, reason[, item]}
    rejected.jsonl        clips a filter dropped: {clip_id, source, start_frame, end_frame, stage, reason, ...}
    summary.json          counts, seconds in and out, throughput, per-stage times, the keep thresholds
    .units/               the ledger: one committed file per finished source (what makes reruns resume)
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vidforge.curate.clipping.decode import AnalyseStage
from vidforge.curate.clipping.plan import PlanStage
from vidforge.curate.clipping.transcode import TranscodeStage
from vidforge.curate.embeddings.greedy_dedup import near_duplicates
from vidforge.curate.executors import make_executor
from vidforge.curate.executors.local import usable_cores
from vidforge.curate.histograms import clip_thresholds
from vidforge.curate.inputs import expand_inputs
from vidforge.curate.items import ClipPlan, ClipResult
from vidforge.curate.stage import Stage, StageStats
from vidforge.curate.video.geometry import geometry_record
from vidforge.curate.video.gpu_decode import decode_placement
from vidforge.data import embeddings as store
from vidforge.data.folder_lock import subfolder
from vidforge.data.manifest import atomic_path, write_json, write_jsonl
from vidforge.data.units import ERRORS, MANIFEST, UnitLedger

CLIPS_DIR = "clips"
EMBEDDINGS = "embeddings.npy"
REJECTED = "rejected.jsonl"
SUMMARY = "summary.json"


@dataclass
class ClipRun:
    """What a run did. `summary` is what summary.json holds; `partial` is true when errors.jsonl is not
    empty (the CLI exits 3)."""

    summary: dict[str, Any]
    stages: list[StageStats] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.summary["errors"] > 0


def build_stages(cfg, out: Path, sources: int, executor: str = "local") -> list[Stage]:
    """The clip pipeline for these settings and this many sources to do (the embedding stage only when
    embeddings are on)."""
    samples = cfg.embed_frames if cfg.embed else 0
    record_to = str(out / CLIPS_DIR) if cfg.record_shots and cfg.trim_seconds == 0 else None
    record_process = cfg.record_process
    if record_process == "auto":  # a core would idle: one source per decode worker, fewer than cores
        # Not in Ray's actors (threaded processes, another machine's cores): it balances sources itself.
        record_process = executor == "local" and sources < usable_cores()
    stages: list[Stage] = [
        AnalyseStage(
            cfg,
            workers=decode_workers(cfg, sources),
            record_to=record_to,
            samples=samples,
            record_process=record_process,
            gpu=decode_placement(cfg.decode_device)[0] == "cuda",
        ),
        PlanStage(cfg),
        TranscodeStage(cfg, out / CLIPS_DIR, samples=samples, workers=cfg.transcode_workers),
    ]
    if cfg.embed:
        from vidforge.curate.embeddings.embedder import EmbedStage

        stages.append(EmbedStage(cfg))
    return stages


def decode_workers(cfg, sources: int) -> int:
    """`curation.decode_workers` with `auto` resolved: a process per usable core, at most one per source
    (the stage's unit of work is a whole source)."""
    if cfg.decode_workers != "auto":
        return cfg.decode_workers
    return max(1, min(usable_cores(), sources))


def run(
    profile,
    inputs: Sequence[str],
    out: str | os.PathLike,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    dedup: float | None = None,
    monitor: Callable[[list[StageStats]], None] | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
) -> ClipRun:
    """Cut `inputs` into clips under `out`. Finished sources are skipped, so a rerun is a no-op and a
    killed run resumes. Bad inputs land in errors.jsonl and the batch goes on."""
    cfg = profile.curation
    if dedup is not None:
        cfg = cfg.model_copy(update={"dedup_threshold": dedup})
    out = Path(out)
    if cfg.detector == "transnetv2" and cfg.transnetv2_weights is not None:
        from vidforge.curate.clipping.transnetv2 import load_model

        load_model(
            cfg.transnetv2_weights, "curation.transnetv2_weights"
        )  # a bad file: refused before any work
    sources = expand_inputs(list(inputs), cfg.extensions)
    ledger = UnitLedger(out)
    ledger.recover()
    subfolder(out, CLIPS_DIR)
    todo = [s for s in sources if not ledger.is_done(s)]
    stages = build_stages(cfg, out, len(todo), executor)
    options = {"queue_depth": cfg.queue_depth}
    if executor == "ray":
        options["address"] = ray_address
    runner = make_executor(executor, **options)
    seconds_in, recorded = 0.0, 0
    started = time.perf_counter()

    def commit(source: str, items: list[Any], errors: list[dict[str, Any]]) -> None:
        nonlocal seconds_in, recorded
        recorded += sum(1 for i in items if isinstance(i, ClipResult) and i.recorded)
        records = []
        for item in sorted(items, key=lambda i: _plan_of(i).start):
            records.append(
                _clip_record(item, out, cfg) if isinstance(item, ClipResult) else _rejected_record(item)
            )
        if items:
            seconds_in += _plan_of(items[0]).info.duration_s
        _write_unit_embeddings(out, source, records)
        # A failure that is not the source's own fault (a worker died, a file vanished) is redone next run.
        retry = any(e.pop("retry", False) for e in errors)
        ledger.commit(source, records, [{"source": source, **e} for e in errors], retry=retry)

    if on_start is not None:
        on_start(
            {
                "sources": len(sources),
                "todo": len(todo),
                "stages": [s.name for s in stages],
                "embedder": _embedder_note(cfg),
                "random_shot_detector": cfg.detector == "transnetv2" and cfg.transnetv2_weights is None,
                "decode_fallback": decode_placement(cfg.decode_device)[1],
            }
        )
    stats = runner.run(stages, ((s, s) for s in todo), commit, monitor) if todo else None
    wall = time.perf_counter() - started
    summary = finalize(out, cfg, sources)
    summary.update(
        {
            "sources_skipped": len(sources) - len(todo),
            "clips_recorded": recorded,  # this run's clips that needed no second decode (record_shots)
            "seconds_in": round(seconds_in, 3),
            "wall_seconds": round(wall, 3),
            "throughput_x_realtime": round(seconds_in / wall, 3) if wall > 0 else 0.0,
            "executor": executor,
            "embedding_model": _embedder_note(cfg),
            "stages": [s.summary() for s in (stats.stages if stats else [])],
            # What the run kept clips by, so that `vidforge review` marks it on its histograms.
            "thresholds": clip_thresholds(cfg),
        }
    )
    write_json(out / SUMMARY, summary)
    return ClipRun(summary, stats.stages if stats else [])


def _write_unit_embeddings(out: Path, source: str, records: list[dict[str, Any]]) -> None:
    """The source's clip embeddings as a store shard (before its ledger commit: a unit whose commit is
    lost is redone and rewrites its shard); the ledger's records then carry no vectors."""
    clips = [r for r in records if r["kind"] == "clip"]
    if not clips or any(r["_embedding"] is None for r in clips):
        return
    store.write_shard(
        out / store.EMBEDDINGS_DIR,
        store.shard_name(source),
        [r["clip_id"] for r in clips],
        np.asarray([r["_embedding"] for r in clips], np.float32),
        {store.DURATION: [r["duration_s"] for r in clips]},
    )
    for r in clips:
        r["_embedding"] = None


def _plan_of(item) -> ClipPlan:
    return item.plan if isinstance(item, ClipResult) else item


def _clip_record(r: ClipResult, out: Path, cfg) -> dict[str, Any]:
    p = r.plan
    return {
        "kind": "clip",
        "clip_id": p.clip_id,
        "path": os.path.relpath(r.path, out),
        "source": p.source,
        "start_frame": p.start,
        "end_frame": p.end,
        "start_s": round(p.start_s, 6),
        "end_s": round(p.end_s, 6),
        "fps": r.fps,
        "width": r.width,
        "height": r.height,
        "frames": r.frames,
        "duration_s": round(r.frames / r.fps, 6),
        "shot_score": None if p.score is None else round(p.score, 4),
        "static_ratio": round(p.static_ratio, 4),
        "stitched": p.stitched > 1,
        "shots": p.stitched,
        "source_fps": float(p.info.fps),
        # The clip is at a constant `fps`: a variable-rate source's frames were re-timed to it.
        "source_variable_rate": p.info.variable_rate,
        "source_width": p.info.width,
        "source_height": p.info.height,
        **geometry_record(p.info, cfg),
        "_embedding": None if r.embedding is None else [float(x) for x in r.embedding],
    }


def _rejected_record(p: ClipPlan) -> dict[str, Any]:
    stage, reason = p.rejected or ("", "")
    return {
        "kind": "rejected",
        "clip_id": p.clip_id,
        "source": p.source,
        "start_frame": p.start,
        "end_frame": p.end,
        "start_s": round(p.start_s, 6),
        "end_s": round(p.end_s, 6),
        "stage": stage,
        "reason": reason,
        "static_ratio": round(p.static_ratio, 4),
        "shots": p.stitched,
    }


def finalize(out: Path, cfg, sources: Sequence[str]) -> dict[str, Any]:
    """Join the ledger into manifest.jsonl, embeddings.npy, errors.jsonl and rejected.jsonl, in an order
    that does not depend on completion order (so a resumed run writes the same files). Applies dedup."""
    ledger = UnitLedger(out)
    wanted = set(sources)
    entries = [e for e in ledger.entries() if e["unit"] in wanted]
    data = [e["data"] for e in entries if e["kind"] == "record"]
    clips = sorted((d for d in data if d["kind"] == "clip"), key=lambda d: (d["source"], d["start_frame"]))
    rejected = [d for d in data if d["kind"] == "rejected"]
    errors = sorted(
        (e["data"] for e in entries if e["kind"] == "error"),
        key=lambda d: (d["source"], d["stage"], str(d.get("item", ""))),
    )
    unit_of = {e["data"]["clip_id"]: e["unit"] for e in entries if e["kind"] == "record"}
    vectors = _clip_vectors(out, clips, unit_of)
    have_embeddings = bool(clips) and all(v is not None for v in vectors)
    matrix = np.asarray(vectors, np.float32) if have_embeddings else np.zeros((0, 0), np.float32)
    if have_embeddings and cfg.dedup_threshold is not None:
        dropped = near_duplicates(matrix, cfg.dedup_threshold)
        for row, (kept, sim) in dropped.items():
            d = clips[row]
            rejected.append(
                {
                    "kind": "rejected",
                    "clip_id": d["clip_id"],
                    "source": d["source"],
                    "start_frame": d["start_frame"],
                    "end_frame": d["end_frame"],
                    "start_s": d["start_s"],
                    "end_s": d["end_s"],
                    "stage": "dedup",
                    "static_ratio": d["static_ratio"],
                    "reason": f"near-duplicate of {clips[kept]['clip_id']} (cosine {sim:.3f})",
                    "shots": d["shots"],
                }
            )
        keep = [i for i in range(len(clips)) if i not in dropped]
        clips, matrix = [clips[i] for i in keep], matrix[keep]
    manifest = []
    for row, d in enumerate(clips):
        record = {k: v for k, v in d.items() if k not in ("kind", "_embedding")}
        record["embedding_row"] = row if have_embeddings else None
        manifest.append(record)
    rejected.sort(key=lambda d: (d["source"], d["start_frame"], d["stage"]))
    write_jsonl(out / MANIFEST, manifest)
    write_jsonl(out / ERRORS, errors)
    write_jsonl(out / REJECTED, [{k: v for k, v in d.items() if k != "kind"} for d in rejected])
    if have_embeddings:
        with atomic_path(out / EMBEDDINGS) as tmp, open(tmp, "wb") as f:
            np.save(f, matrix)
        _write_store_index(out, cfg, clips, matrix, unit_of)
    else:
        (out / EMBEDDINGS).unlink(missing_ok=True)
        (out / store.EMBEDDINGS_DIR / store.INDEX).unlink(missing_ok=True)
    failed = {e["source"] for e in errors} - {d["source"] for d in clips}
    return {
        "sources": len(sources),
        "sources_failed": len(failed),
        "clips": len(manifest),
        "rejected": dict(sorted(Counter(d["stage"] for d in rejected).items())),
        "errors": len(errors),
        "seconds_out": round(sum(d["duration_s"] for d in manifest), 3),
    }


def _clip_vectors(out: Path, clips: list[dict[str, Any]], unit_of: dict[str, str]) -> list:
    """Each clip's vector from its source's store shard (or, in a ledger written before the store
    existed, from the record itself); None where there is none."""
    found: dict[str, np.ndarray] = {}
    folder = out / store.EMBEDDINGS_DIR
    for unit in sorted({unit_of[d["clip_id"]] for d in clips}):
        name = store.shard_name(unit)
        if store.has_shard(folder, name):
            ids = np.load(folder / f"{name}.ids.npy")
            vectors = np.load(folder / f"{name}.vectors.npy")
            found.update(zip(ids.tolist(), vectors, strict=True))
    return [d["_embedding"] if d.get("_embedding") is not None else found.get(d["clip_id"]) for d in clips]


def _write_store_index(
    out: Path, cfg, clips: list[dict[str, Any]], matrix: np.ndarray, unit_of: dict[str, str]
) -> None:
    """The store's index in manifest order. A source's shard is rewritten when it does not hold exactly
    the source's kept clips (`--dedup` dropped some, or an old ledger had no shards)."""
    folder = out / store.EMBEDDINGS_DIR
    rows_of: dict[str, list[int]] = {}
    for row, d in enumerate(clips):
        rows_of.setdefault(unit_of[d["clip_id"]], []).append(row)
    names = []
    for unit, rows in rows_of.items():
        name = store.shard_name(unit)
        ids = [clips[r]["clip_id"] for r in rows]
        current = np.load(folder / f"{name}.ids.npy").tolist() if store.has_shard(folder, name) else None
        if current != ids:
            store.write_shard(
                folder, name, ids, matrix[rows], {store.DURATION: [clips[r]["duration_s"] for r in rows]}
            )
        names.append(name)
    model = {"name": cfg.embed_model, "checkpoint": cfg.embed_checkpoint, "frames": cfg.embed_frames}
    store.write_index(folder, names, model, [store.DURATION])


def _embedder_note(cfg) -> str | None:
    if not (cfg.embed or cfg.stitch):
        return None
    if cfg.embed_checkpoint or cfg.embed_model.startswith("local-dir:"):
        return f"{cfg.embed_model} (local weights)"
    return f"{cfg.embed_model} (random weights: no curation.embed_checkpoint)"
