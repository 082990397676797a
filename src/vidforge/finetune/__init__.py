"""`vidforge finetune VIDEOS_DIR --base BASE -o RUN`: a folder of captioned videos and a base model to a
fine-tuned model (LoRA by default), through the pipeline's own stages.

The stages are the commands a user could run one by one, each called through the function its command
calls, each writing its own folder under RUN:

    RUN/profile.yaml   the resolved profile every stage reads (`--profile RUN/profile.yaml` reruns one)
    RUN/captions.csv   `path,caption` of every video: what `clip` reads as its list and `caption` as its sidecar
    RUN/clips          `vidforge clip`: the videos as they are (one clip each), or cut into shots (--cut)
    RUN/captioned      `vidforge caption`: the captions from the sidecars, no quality filter
    RUN/shards         `vidforge shard`: caption embeddings by the base model's text encoder
    RUN/latents        `vidforge tokenize`: latents by the base model's VAE
    RUN/train          `vidforge train --init BASE --resume`: checkpoints, metrics, validation videos, export/
    RUN/diffusers      (a full fine-tune of a wan model) `vidforge model export --to diffusers`
    RUN/train/review   `vidforge review RUN/train`

A finished stage leaves RUN/.finetune/STAGE.json (its command and the digest of what it read); a rerun of
the same command passes over it, and an unfinished stage resumes as its own command does (each stage
skips the units it committed; training resumes from its latest checkpoint). Videos added or removed rerun
the data stages, whose ledgers redo only those videos' units (every other clip is kept); a data stage that
finished on other settings, or on another version of a video or caption it still reads, is refused, naming
the folders to remove: its own ledger would keep what it made from the old ones. Before any of it, the memory model (`vidforge bench plan`) checks the training
step fits the profile's accelerator, and a recipe that does not is refused with the smallest change that
does.

Where the captions come from (as finetrainers, musubi-tuner and diffusion-pipe take them): a `.txt` beside
each video with the same stem, or one table in the folder or given as --captions: a CSV with a header or
a JSONL, naming the video in `path`, `file_name`, `video` or `video_path` (relative to the table's folder)
and the caption in `caption`, `text` or `prompt`."""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidforge.errors import Terminated, UserInputError
from vidforge.families import family
from vidforge.files import FINETUNE_TRAIN, atomic_file, read_csv, read_text, read_text_inside, write_text
from vidforge.finetune import preflight
from vidforge.finetune.sizing import sized_settings, training_clip
from vidforge.profile import RunProfile
from vidforge.profile.layout_rules import SamplingRun, sampling_run_problems
from vidforge.profile.loading import dump_profile
from vidforge.profile.overrides import Override, Settings, as_overrides, command_line

STATE_DIR = ".finetune"
CAPTIONS = "captions.csv"
PROFILE = "profile.yaml"
VIDEO_COLUMNS = ("path", "file_name", "video", "video_path")
CAPTION_COLUMNS = ("caption", "text", "prompt")
TABLE_SUFFIXES = (".csv", ".jsonl")
DATA_FOLDERS = {"clip": "clips", "caption": "captioned", "shard": "shards", "tokenize": "latents"}

# The clip stage with nothing cut and nothing filtered: one clip a video, as a user's fine-tuning set comes.
AS_THEY_ARE = {
    "curation.detector": "content",
    "curation.content_threshold": 1000000,  # above any frame difference (at most 255): no shot is cut
    "curation.stitch": False,
    "curation.static_max_ratio": 1,
    "curation.min_seconds": 0,
    "curation.max_seconds": 1000000,
    "curation.embed": False,  # embeddings serve stitching and dedup, neither of which runs here
}
# The caption stage as the captions' reader alone: a user's captions are the point, not a filter's say.
SIDECAR_ONLY = {
    "curation.caption.backend": "sidecar",
    "curation.caption.fallback": None,
    "curation.caption.aesthetic.enabled": False,
    "curation.caption.ocr.enabled": False,
    "curation.caption.watermark.enabled": False,
    "curation.caption.motion.enabled": False,
    "curation.caption.clip_score.enabled": False,
    "curation.caption.reject_flagged_captions": False,
}
# A fine-tune's training defaults (the user's --set wins): LoRA as finetrainers, musubi-tuner and
# diffusion-pipe default to (rank 16 on the attention projections, lr 1e-4), a full fine-tune at Wan's
# published fine-tuning lr (1e-5). No warm-up until the run's length is known (`sizing`: a short one).
LORA_DEFAULTS = {"train.lora": {"rank": 16, "alpha": 16}, "train.lr": 1e-4, "train.warmup_steps": 0}
FULL_DEFAULTS = {"train.lora": None, "train.lr": 1e-5, "train.warmup_steps": 0}


@dataclass(frozen=True)
class Request:
    """What `vidforge finetune` was asked."""

    videos: Path
    base: Path
    out: Path
    captions: Path | None = None
    full: bool = False
    cut: bool = False
    steps: int | None = None
    prompts: tuple[str, ...] = ()
    validate_every: int | None = None
    profile: str | None = None
    overrides: tuple[Override | str, ...] = ()
    """The user's --set, typed (a str is read as `--set` reads it)."""
    nproc: int | None = None
    """Train as this many local ranks (`vidforge train --nproc N`, started by this command); the data
    stages run in this process."""
    reschedule: bool = False
    """Resumed training fits the profile's lr schedule from the resumed step (`train --reschedule`)."""
    dry_run: bool = False
    """Every check before the first stage (the device, buckets, validation size, short videos, stale
    stages, the memory fit) and the resolved profile, then the stages listed, none run and nothing written."""


@dataclass
class StageRun:
    name: str
    command: str
    skipped: bool
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class FinetuneSummary:
    out: str
    stages: list[StageRun]
    model: str | None
    """Where the fine-tuned weights are: the LoRA (diffusers' format) or the full model's folder."""
    validation: str | None
    review: str | None
    next: list[str] = field(default_factory=list)
    """What to run with the result: sampling it, loading it in diffusers, merging a LoRA."""
    plan: dict[str, Any] = field(default_factory=dict)
    """A dry run's resolved settings and memory fit (`dry_run_plan`); empty for a run."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "model": self.model,
            "validation": self.validation,
            "review": self.review,
            "next": list(self.next),
            **({"dry_run": self.plan} if self.plan else {}),
            "stages": [
                {"stage": s.name, "skipped": s.skipped, "command": s.command, **s.result} for s in self.stages
            ],
        }


class Hooks:
    """What the caller shows while the stages run (the CLI: progress bars, lines, --json events):
    `progress(name)` is the context a stage runs in, yielding the progress keyword arguments of that
    stage's function."""

    def stage(self, name: str, command: str, skipped: bool) -> None:
        """A stage starts (or is passed over: done by an earlier run); `command` runs it alone."""

    def progress(self, name: str, total: int | None = None) -> AbstractContextManager[dict[str, Any]]:
        """`total`: the stage's count when known before it starts (training's steps)."""
        return nullcontext({})

    def notice(self, line: str) -> None:
        """A line worth the user's eye (training's resume and validation lines)."""


# --- the data ------------------------------------------------------------------------------------------


def _column(names: Sequence[str], wanted: Sequence[str], table: Path, what: str) -> str:
    for name in wanted:
        if name in names:
            return name
    raise UserInputError(
        f"{table}: no {what} column; name it one of {', '.join(wanted)} (found {', '.join(names) or 'none'})"
    )


def read_table(table: Path) -> list[tuple[Path, str]]:
    """(video, caption) rows of a CSV (with a header) or JSONL captions table; relative paths are relative
    to the table's folder."""
    if table.suffix.lower() == ".jsonl":
        rows = []
        for number, line in enumerate(read_text(table, "the captions table").splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UserInputError(f"{table}: line {number} is not JSON ({err.msg})") from None
                if not isinstance(row, dict):
                    raise UserInputError(f"{table}: line {number} is not a JSON object")
                rows.append(row)
    else:
        rows = read_csv(table, "the captions table")[1]
    if not rows:
        raise UserInputError(f"{table}: no rows; one a video: its path and its caption")
    names = list(rows[0])
    video, caption = (
        _column(names, VIDEO_COLUMNS, table, "video"),
        _column(names, CAPTION_COLUMNS, table, "caption"),
    )
    out = []
    for row in rows:
        path = Path(str(row.get(video) or ""))
        out.append(
            (_absolute(path if path.is_absolute() else table.parent / path), str(row.get(caption) or ""))
        )
    return out


def _absolute(path: Path) -> Path:
    """An absolute path with links kept: a linked video's caption file is the one beside the link."""
    return Path(os.path.abspath(path))


def gather_captions(
    videos_dir: Path, extensions: Sequence[str], captions: Path | None = None
) -> list[tuple[Path, str]]:
    """Every video of `videos_dir` with its caption: from `captions` (a table), else from the one table in
    the folder, else from the `.txt` beside each video. A video without a caption, or a row naming no
    video, is refused (the line names the first), as is an empty folder."""
    if not videos_dir.is_dir():
        raise UserInputError(f"{videos_dir}: not a folder; pass the folder of videos to fine-tune on")
    exts = {e.lower() for e in extensions}
    videos = sorted(_absolute(p) for p in videos_dir.rglob("*") if p.is_file() and p.suffix.lower() in exts)
    if not videos:
        raise UserInputError(
            f"{videos_dir}: no videos ({', '.join(sorted(exts))}); put the videos to fine-tune on there"
        )
    if captions is None:
        tables = sorted(p for p in videos_dir.iterdir() if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
        if len(tables) > 1:
            raise UserInputError(
                f"{videos_dir}: several caption tables ({', '.join(p.name for p in tables)}); name one with --captions"
            )
        captions = tables[0] if tables else None
    if captions is not None:
        if not captions.is_file():
            raise UserInputError(f"--captions {captions}: no such file; give a CSV or JSONL of path,caption")
        table = dict(read_table(captions))
        missing = [str(p) for p in table if not p.is_file()]
        if missing:
            raise UserInputError(f"{captions}: {len(missing)} row(s) name no file, e.g. {missing[0]}")
        uncaptioned = [p for p in videos if p not in table]
        if uncaptioned:
            raise UserInputError(
                f"{captions}: no caption for {len(uncaptioned)} video(s) of {videos_dir}, e.g. {uncaptioned[0]}; "
                "add a row for each, or move them out"
            )
        pairs = [(p, table[p]) for p in videos]
    else:
        uncaptioned = [p for p in videos if not p.with_suffix(".txt").is_file()]
        if uncaptioned:
            raise UserInputError(
                f"{uncaptioned[0]}: no caption beside it ({uncaptioned[0].with_suffix('.txt').name}); give each "
                f"video a .txt of its caption, or one captions.csv / .jsonl of path,caption"
                + (f" ({len(uncaptioned)} videos lack one)" if len(uncaptioned) > 1 else "")
            )
        pairs = [
            (p, read_text_inside(p.with_suffix(".txt"), videos_dir, "its caption").strip()) for p in videos
        ]
    empty = [p for p, text in pairs if not text.strip()]
    if empty:
        raise UserInputError(f"{empty[0]}: an empty caption ({len(empty)} video(s)); write what each shows")
    return pairs


def write_captions(pairs: Sequence[tuple[Path, str]], path: Path) -> None:
    """The captions as the CSV `path,caption` that `clip` reads as its list and `caption` as its sidecar."""
    with atomic_file(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "caption"])
        writer.writerows((str(p), " ".join(text.split())) for p, text in pairs)


# --- the profile ---------------------------------------------------------------------------------------


def base_profile(base: Path, profile: str | None, overrides: Settings) -> RunProfile:
    """The profile of a fine-tune of `base` as `vidforge infer -c BASE` and `train --init BASE` read it: a
    diffusers folder's transformer, VAE and text encoder, or a vidforge run's own profile; then
    `overrides`."""
    from vidforge.lora import find_adapter
    from vidforge.weights.weights_folder import export_profile, published_profile, resolve_weights

    if not base.exists():
        raise UserInputError(f"--base {base}: no such folder; a diffusers Wan folder or a vidforge run")
    if find_adapter(base) is not None:
        raise UserInputError(
            f"--base {base}: a LoRA run, not a model; fine-tune its merged weights (vidforge model export "
            f"{base} --merged --to vidforge -o MERGED, then --base MERGED) or its own base"
        )
    weights = resolve_weights(base, "--base")
    if weights.export is None:
        resolved = published_profile(weights.published, overrides, profile)
        if resolved.tokenizer.kind == "pixel" or resolved.text_encoder.kind == "open-clip":
            raise UserInputError(
                f"--base {base}: a transformer folder alone; pass the whole pipeline folder (beside its vae/ "
                "and text_encoder/), or name them with --set tokenizer.path=... --set text_encoder.path=..."
            )
        return resolved
    resolved = export_profile(weights.export, overrides, profile)
    if resolved.tokenizer.kind == "pixel":  # weightless: its latent width is known before any stage runs
        from vidforge.tokenizers.base import build_tokenizer

        channels = build_tokenizer(resolved).latent_channels
        if channels != resolved.model.in_channels:
            raise UserInputError(
                f"--base {base}: its model takes {resolved.model.in_channels} latent channels, its profile's "
                f"pixel tokenizer gives {channels}; name the VAE it was trained with (--set tokenizer.kind=wan "
                "--set tokenizer.path=VAE_FOLDER) and its text encoder (text_encoder.kind, text_encoder.path)"
            )
    return resolved


def stage_overrides(request: Request, captions: Path) -> list[Override]:
    """What the finetune sets for its stages, before the user's --set (which wins)."""
    sets: dict[str, Any] = {**({} if request.cut else AS_THEY_ARE), **SIDECAR_ONLY}
    sets["curation.caption.sidecar.path"] = str(captions)
    sets.update(FULL_DEFAULTS if request.full else LORA_DEFAULTS)
    if request.steps is not None:
        sets["train.steps"] = request.steps
    if request.prompts:
        sets["train.validation_prompts"] = list(request.prompts)
    if request.validate_every is not None:
        sets["train.validate_every"] = request.validate_every
    if request.reschedule:
        sets["train.resume_schedule"] = "refit"
    return as_overrides(sets)


def check_fits(profile: RunProfile) -> Any:
    """The training step at the largest bucket fits the profile's accelerator by the memory model, or a
    UserInputError naming the smallest change that fits (`vidforge bench plan`'s own refusal); returns
    the plan (`vidforge.bench.plan.LayoutPlan`)."""
    from vidforge.bench.fit import clip_sets, variant
    from vidforge.bench.plan import evaluate
    from vidforge.profile.loading import ProfileError

    try:
        sized = variant(profile, clip_sets(profile, training_clip(profile)))
    except ProfileError as err:
        raise UserInputError(str(err)) from None
    plan = evaluate(sized)
    if plan.memory is not None and not plan.valid:
        from vidforge.bench.fit import refusal, smallest_change

        change = smallest_change(sized, plan)
        if change is not None:
            change.sets = _clip_as_data_sets(sized, change.sets)
        raise UserInputError(refusal(plan, change, "finetune"))
    return plan


def dry_run_plan(profile: RunProfile, plan: Any) -> dict[str, Any]:
    """What a dry run shows of the resolved profile: the settings finetune sized, the recompute
    `train.activation_checkpointing: auto` resolves to, and the memory model's step at the largest bucket."""
    from vidforge.estimate.recompute import resolve_auto

    frames, height, width = training_clip(profile)
    _, choice = resolve_auto(profile)
    memory = plan.memory.total if plan.memory is not None else None
    return {
        "model": f"{profile.model.family} {profile.model.layers} layers x {profile.model.hidden}",
        "clip": f"{frames}x{height}x{width}",
        "data.token_budget": profile.data.token_budget,
        "train.steps": profile.train.steps,
        "train.warmup_steps": profile.train.warmup_steps,
        "train.log_every": profile.train.log_every,
        "train.lora": None if profile.train.lora is None else profile.train.lora.model_dump(mode="json"),
        "train.activation_checkpointing": profile.train.activation_checkpointing,
        "recompute": choice.describe() if choice is not None else None,
        "infer": f"{profile.infer.frames}x{profile.infer.height}x{profile.infer.width} at {profile.infer.fps} fps",
        "cluster.accelerator": profile.cluster.accelerator.name,
        "memory_gib": None if memory is None else round(memory / 2**30, 2),
        "memory_limit_gib": round(plan.capacity_bytes / 2**30, 2),
    }


def _clip_as_data_sets(profile: RunProfile, sets: dict[str, Any]) -> dict[str, Any]:
    """A recipe's smaller clip (bench.latent_*, what the planner sizes) as the data settings a fine-tune
    trains it at (data.frame_buckets, data.buckets in pixels)."""
    latent = {
        k: int(sets.pop(f"bench.latent_{k}"))
        for k in ("frames", "height", "width")
        if f"bench.latent_{k}" in sets
    }
    if not latent:
        return sets
    frames, height, width = training_clip(profile)
    ct, cs = profile.tokenizer.temporal_compression, profile.tokenizer.spatial_compression
    if "frames" in latent:
        frames = (latent["frames"] - 1) * ct + 1
    height, width = latent.get("height", height // cs) * cs, latent.get("width", width // cs) * cs
    return {"data.frame_buckets": [frames], "data.buckets": [[height, width]], **sets}


# --- the stages ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageKey:
    """What a data stage read. `key`: all of it (a change reruns the stage, whose own ledger then redoes
    only the units whose inputs changed: an added video's clips, say); `settings`: what no unit's name
    shows; `sources`: per source video, what its units were made from (its size and mtime; its caption).
    A changed `settings` or source is stale (`_Ledger.refuse_stale`)."""

    key: str
    settings: str
    sources: dict[str, Any] = field(default_factory=dict)

    def stale(self, record: dict[str, Any]) -> bool:
        if "settings" not in record:  # a record from before per-source keys: all or nothing
            return record.get("key") != self.key
        old = record.get("sources", {})
        return record["settings"] != self.settings or any(
            old[p] != v for p, v in self.sources.items() if p in old
        )


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _command(*argv: Any) -> str:
    return command_line("vidforge", *argv)


class _Ledger:
    """RUN/.finetune/STAGE.json: a stage that finished on these inputs, with the command that ran it."""

    def __init__(self, out: Path):
        self.folder = out / STATE_DIR

    def record(self, name: str) -> dict[str, Any] | None:
        """The stage's record; None when it never finished, or its data folder was removed since (the
        stale-stage message's advice: removing the folders is all it takes)."""
        path = self.folder / f"{name}.json"
        if name in DATA_FOLDERS and not (self.folder.parent / DATA_FOLDERS[name]).is_dir():
            return None
        return json.loads(path.read_text()) if path.is_file() else None

    def refuse_stale(self, keys: dict[str, StageKey], out: Path, train_dir: Path) -> None:
        """A data stage that finished on other settings, or on another version of a video or caption it
        still reads, is refused rather than mixed, naming what to remove: its own ledger keeps a unit by its
        name (a source's path, a clip's id) and would keep what it made from the old one. Videos added or
        removed are not stale: the stage reruns and its ledger redoes only their units."""
        for name, key in keys.items():
            record = self.record(name)
            if record is not None and key.stale(record):
                stale = list(DATA_FOLDERS.values())[list(DATA_FOLDERS).index(name) :]
                raise UserInputError(
                    f"{name}: {out / DATA_FOLDERS[name]} was made from other videos, captions or settings; to "
                    f"redo it: {command_line('rm', '-r', *(out / f for f in stale))} (and {train_dir} to "
                    "train afresh), or pass a new -o"
                )

    def mark(self, name: str, key: str, command: str, result: dict[str, Any], **seen: Any) -> None:
        """`seen`: a data stage's settings digest and per-source inputs (`StageKey`), for `refuse_stale`."""
        record = {"key": key, "command": command, "result": result, **seen}
        write_text(self.folder / f"{name}.json", json.dumps(record, indent=1))


def _partial(name: str, result: Any, out: Path) -> None:
    """A data stage that left errors (exit 3 from its own command): the fine-tune stops there, naming the
    first failed source video (a later stage's records name clips: found in RUN/clips' manifest)."""
    first = _first_failed_source(out)
    raise UserInputError(
        f"{name}: {result} error(s) (see {out / 'errors.jsonl'})"
        + (f", e.g. {first}" if first else "")
        + "; fix or remove those videos and rerun"
    )


def _first_failed_source(folder: Path) -> str | None:
    """`folder`/errors.jsonl's first record as `VIDEO: reason`: its `source`, or the source video of the
    clip its key or item names."""
    errors = folder / "errors.jsonl"
    try:
        record = json.loads(errors.read_text().splitlines()[0])
    except (OSError, IndexError, json.JSONDecodeError):
        return None
    source = record.get("source")
    if source is None:
        names = [str(record[k]) for k in ("key", "item", "id", "clip_id") if k in record]
        manifest = folder.parent / DATA_FOLDERS["clip"] / "manifest.jsonl"
        clips = manifest.read_text().splitlines() if manifest.is_file() else []
        for line in clips:
            clip = json.loads(line)
            if any(str(clip.get("clip_id")) in name for name in names):
                source = clip.get("source")
                break
    return f"{source}: {record.get('reason', '')}".strip() if source else None


def _check(request: Request, base: Path, sets: Sequence[Override], profile: RunProfile) -> Any:
    """Everything about the settings that can refuse the run, before any stage (`preflight`). Training's
    world (--nproc N) is what the memory is checked against; the data stages run here, alone."""
    if not request.dry_run:  # a dry run plans for the profile's card, wherever it runs
        preflight.check_accelerator(profile)
    preflight.check_buckets(profile)
    preflight.check_validation(profile)
    if request.nproc:
        from vidforge.parallel.launch import nproc_overrides

        overrides = [*sets, *as_overrides(request.overrides), *nproc_overrides(request.nproc)]
        return check_fits(base_profile(base, request.profile, overrides))
    return check_fits(profile)


def run(request: Request, hooks: Hooks | None = None) -> FinetuneSummary:
    """Run (or resume) the fine-tune `request` describes; see the module's docstring."""
    hooks = hooks or Hooks()
    out = request.out.resolve()
    base = request.base.resolve()
    if out.is_relative_to(request.videos.resolve()):
        raise UserInputError(
            f"-o {request.out}: inside the videos' folder {request.videos}, whose clips a rerun would take "
            "for videos; put the run elsewhere"
        )
    captions = out / CAPTIONS
    profile, plan = _resolve(request, base, captions)
    pairs = gather_captions(request.videos, profile.curation.extensions, request.captions)
    pairs = preflight.drop_short(pairs, profile, out, hooks.notice, write=not request.dry_run)
    dumped = profile.model_dump(mode="json")
    keys = _stage_keys(pairs, dumped)
    clip_key, caption_key, shard_key, data_key = keys.values()
    ledger, stages = _Ledger(out), []
    train_dir = out / FINETUNE_TRAIN
    ledger.refuse_stale(keys, out, train_dir)
    profile_path = out / PROFILE
    if not request.dry_run:
        out.mkdir(parents=True, exist_ok=True)
        write_captions(pairs, captions)
        write_text(profile_path, dump_profile(profile))
    prof = ("--profile", profile_path)
    clips, captioned, shards, latents = (out / DATA_FOLDERS[name] for name in DATA_FOLDERS)

    def stage(
        name: str,
        key: str | StageKey,
        command: str,
        work: Callable[[dict[str, Any]], dict[str, Any]],
        total: int | None = None,
    ) -> dict:
        seen = {}
        if isinstance(key, StageKey):
            seen = {"settings": key.settings, "sources": key.sources}
            key = key.key
        record = ledger.record(name)
        if record is not None and record.get("key") != key:
            record = None  # training on a changed profile resumes (train keeps its schedule)
        hooks.stage(name, command, record is not None)
        if record is not None or request.dry_run:  # a dry run lists the stage, runs none
            stages.append(StageRun(name, command, record is not None, (record or {}).get("result", {})))
            return (record or {}).get("result", {})
        with hooks.progress(name, total) as progress:
            result = work(progress)
        ledger.mark(name, key, command, result, **seen)
        stages.append(StageRun(name, command, False, result))
        return result

    _data_stages(profile, out, prof, keys, stage)

    train_argv = ["train", "--data", latents, "--run-dir", train_dir, "--init", base, *prof, "--resume"]
    train_argv += ["--nproc", request.nproc] if request.nproc else []

    def train(progress: dict[str, Any]) -> dict[str, Any]:
        from vidforge.train.init_weights import WeightsInit
        from vidforge.train.loop import run as train_run

        if request.nproc:  # the printed command itself, as its ranks
            from vidforge.infer.weights import exported_step
            from vidforge.parallel.launch import launch_workers

            launch_workers(request.nproc, [str(a) for a in train_argv])
            return {"last_step": exported_step(train_dir / "export"), "export": str(train_dir / "export")}
        try:
            summary = train_run(
                profile,
                [str(latents)],
                train_dir,
                resume=True,
                init=WeightsInit(base),
                notice=hooks.notice,
                **progress,
            )
        except Terminated as stopped:  # this command resumes by itself: it is the one to rerun
            said = str(stopped).split("; rerun", 1)[0]
            raise Terminated(f"{said}; rerun the same `vidforge finetune` command to continue") from None
        return {
            "last_step": summary.last_step,
            "final_loss_mean": summary.final_loss_mean,
            "export": summary.export_dir,
        }

    train_key = _digest(data_key.key, dumped, str(base))
    trained = stage(
        "train",
        train_key,
        _command(*train_argv),
        train,
        profile.train.steps,
    )
    model = trained.get("export")
    if profile.train.lora is None and family(profile.model.family).export_weights is not None:

        def export(progress: dict[str, Any]) -> dict[str, Any]:  # a full fine-tune, in the published layout
            from vidforge.weights.weights_folder import export_published

            written = export_published(train_dir / "export", out / "diffusers" / "transformer", 5 * 2**30)
            return {"diffusers": str(written)}

        exported = stage(
            "export",
            train_key,
            _command(
                "model",
                "export",
                train_dir / "export",
                "--to",
                "diffusers",
                "-o",
                out / "diffusers" / "transformer",
            ),
            export,
        )
        model = exported["diffusers"]

    def review(progress: dict[str, Any]) -> dict[str, Any]:
        from vidforge.review.build import run as review_run

        return {"page": str(review_run(train_dir, None, **progress).page)}

    page = stage("review", train_key, _command("review", train_dir), review).get("page")
    validation = train_dir / "validation"
    if request.dry_run:
        return FinetuneSummary(str(out), stages, None, None, None, plan=dry_run_plan(profile, plan))
    after = _next_commands(profile, base, out, model, pairs[0][1])
    return FinetuneSummary(
        str(out), stages, model, str(validation) if validation.is_dir() else None, page, after
    )


def _data_stages(
    profile: RunProfile,
    out: Path,
    prof: tuple[str, Path],
    keys: dict[str, StageKey],
    stage: Callable[..., dict],
) -> None:
    """clip, caption, shard and tokenize, each through `stage` (passed over when its record holds)."""
    captions = out / CAPTIONS
    clips, captioned, shards, latents = (out / DATA_FOLDERS[name] for name in DATA_FOLDERS)
    clip_key, caption_key, shard_key, data_key = keys.values()

    def clip(progress: dict[str, Any]) -> dict[str, Any]:
        from vidforge.curate.clip import run as clip_run

        result = clip_run(profile, [str(captions)], clips, **progress)
        if result.partial:
            _partial("clip", result.summary["errors"], clips)
        return {"clips": result.summary.get("clips")}

    def caption(progress: dict[str, Any]) -> dict[str, Any]:
        from vidforge.curate.caption import run as caption_run

        summary = caption_run(profile, clips, captioned, **progress)
        if summary.errors:
            _partial("caption", summary.errors, captioned)
        return {"captioned": summary.kept}

    def shard(progress: dict[str, Any]) -> dict[str, Any]:
        from vidforge.data.sharding import run as shard_run

        summary = shard_run(profile, captioned, shards, **progress)
        if summary.rejected:
            _partial("shard", summary.rejected, shards)
        return {"shards": summary.shards}

    def tokenize(progress: dict[str, Any]) -> dict[str, Any]:
        from vidforge.tokenizers.tokenize import run as tokenize_run

        summary = tokenize_run(profile, shards, latents, **progress)
        if summary.rejected:
            _partial("tokenize", summary.rejected, latents)
        return {"latent_shards": summary.as_dict().get("shards")}

    stage("clip", clip_key, _command("clip", captions, "-o", clips, *prof), clip)
    stage("caption", caption_key, _command("caption", clips, "-o", captioned, *prof), caption)
    stage("shard", shard_key, _command("shard", captioned, "-o", shards, *prof), shard)
    stage("tokenize", data_key, _command("tokenize", shards, "-o", latents, *prof), tokenize)


def _resolve(request: Request, base: Path, captions: Path) -> tuple[RunProfile, Any]:
    """The run's profile: the stages' settings, then what finetune sizes from the buckets and the base,
    under the user's --set; checked (`_check`) before any stage, with the memory model's plan."""
    sets, user = stage_overrides(request, captions), as_overrides(request.overrides)
    profile = base_profile(base, request.profile, [*sets, *user])
    sets += sized_settings(profile, user)
    profile = base_profile(base, request.profile, [*sets, *user])
    return profile, _check(request, base, sets, profile)


def _stage_keys(pairs: Sequence[tuple[Path, str]], dumped: dict[str, Any]) -> dict[str, StageKey]:
    """What each data stage reads (`StageKey`), each holding the one before it."""
    curation = {k: v for k, v in dumped["curation"].items() if k != "caption"}
    videos = {str(p): [p.stat().st_size, p.stat().st_mtime_ns] for p, _ in pairs}
    captions = {str(p): text for p, text in pairs}
    clip = StageKey(_digest(videos, curation), _digest(curation), videos)
    caption_settings = _digest(clip.settings, dumped["curation"]["caption"])
    caption = StageKey(_digest(clip.key, captions, caption_settings), caption_settings, captions)
    shard_settings = _digest(caption_settings, dumped["text_encoder"], dumped["data"])
    shard = StageKey(_digest(caption.key, shard_settings), shard_settings)
    tokenize_settings = _digest(shard_settings, dumped["tokenizer"])
    tokenize = StageKey(_digest(shard.key, tokenize_settings), tokenize_settings)
    return {"clip": clip, "caption": caption, "shard": shard, "tokenize": tokenize}


def _next_commands(profile: RunProfile, base: Path, out: Path, model: str | None, caption: str) -> list[str]:
    """What to run with the result: sampling it (from a first frame too, for a model that kept both tasks),
    merging a LoRA, loading it in diffusers."""
    from vidforge.infer.weights import find_export
    from vidforge.lora import diffusers_loading

    prompt = (profile.train.validation_prompts or [caption])[0]
    first_frame = ("--image", "FIRST_FRAME.png")  # a first frame the user picks
    # an image-to-video model samples from one only
    image = first_frame if profile.model.samples_from_image else ()
    # the run folder itself: its readers look in its train stage's export (`files.weights_places`)
    weights = ("-c", base, "--lora", out) if profile.train.lora is not None else ("-c", out)
    after = [_command("infer", *weights, *image, "--prompt", prompt, "-o", out / "samples")]
    if _keeps_both_tasks(profile):
        after.append(
            _command("infer", *weights, *first_frame, "--prompt", prompt, "-o", out / "samples_from_image")
        )
    if profile.train.lora is not None:
        after.append(_command("model", "export", out, "--merged", "-o", out / "merged" / "transformer"))
        if find_export(base) is None:
            index = Path(base) / "model_index.json"  # a pipeline folder names its class
            pipeline = json.loads(index.read_text()).get("_class_name") if index.is_file() else None
            pipeline = pipeline or "WanPipeline"
            after.append(
                f"diffusers: {pipeline}.from_pretrained({str(base)!r}){diffusers_loading(pipeline, model)}"
            )
    return after


def _keeps_both_tasks(profile: RunProfile) -> bool:
    """A model that samples from text and, optionally, from a first frame, and trained on both
    (diffusion.image_condition > 0: Wan2.2 TI2V-5B, LTX-2's image-to-video folders): `vidforge infer`
    takes an --image for it (the sampling rulebook) without needing one."""
    if profile.model.samples_from_image or not profile.diffusion.image_condition:
        return False
    return not sampling_run_problems(profile, SamplingRun(image=True))
