"""`curation.caption`: settings of `vidforge caption` (captioner backend, quality annotations, keep/reject thresholds).

Every model loads from a local path; nothing is downloaded. `random_weights: true` builds the models that
have no path with random weights instead of refusing: for tests and demos only, and recorded in each
output record (`random_weights`) and in `summary.json`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vidforge.section import Section

VCHITECT_PROMPT = (
    "Please provide a detailed description of the video, focusing on the main subjects, their actions, "
    "and the background scenes."
)


class CocaCaptioner(Section):
    """open-clip CoCa captions of keyframes, merged into one caption per clip."""

    model: str = "coca_ViT-L-14"
    """open-clip model: a built-in name (`coca_ViT-B-32`, `coca_ViT-L-14`) whose weights come from
    `checkpoint`, or `local-dir:/path` (a folder with `open_clip_config.json` and the weights)."""
    checkpoint: str | None = None
    """Local open-clip checkpoint file for a built-in `model` name (e.g.
    `mscoco_finetuned_CoCa-ViT-L-14-laion2B-s13B-b90k.bin`). Not used with `local-dir:`."""
    frames: int = Field(3, ge=1, le=64)
    """Keyframes captioned per clip, evenly spaced with both ends included: 1 = the middle frame,
    3 = first/middle/last."""
    merge: Literal["join", "middle"] = "join"
    """How the keyframe captions become one: `join` the distinct ones as sentences in time order, or
    keep the `middle` keyframe's caption."""
    batch_size: int = Field(16, ge=1)
    """Images per forward pass (keyframes of several clips are batched together)."""
    max_tokens: int = Field(30, ge=6, le=76)
    """Longest generated caption, in tokens (start and end tokens included)."""
    repetition_penalty: float = Field(1.2, ge=1.0)
    """Penalty on tokens already generated (1.0 = none); discourages degenerate loops."""


class ChatEndpoint(Section):
    """An OpenAI-compatible chat-completions server (vLLM, SGLang...): where it is and how it is called.
    Shared by the `endpoint` captioner and caption enhancement (one HTTP client: curate/captioning/chat.py)."""

    url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the server; requests go to `<url>/chat/completions`."""
    model: str = "Qwen/Qwen2.5-VL-7B-Instruct"
    """Model name sent in each request (the name the server serves)."""
    api_key_env: str | None = "VIDFORGE_CAPTION_API_KEY"
    """Environment variable holding the API key, sent as a Bearer token; unset or empty sends none.
    The key itself never appears in profiles, logs or outputs. It must be a VIDFORGE_* variable or one
    listed in $VIDFORGE_API_KEY_ENVS (a shared profile cannot send HOME or a cloud token to its URL)."""
    max_tokens: int = Field(256, ge=1)
    """Longest answer the server may generate."""
    temperature: float = Field(0.0, ge=0.0)
    """Sampling temperature (0 = greedy, reproducible)."""
    concurrency: int = Field(8, ge=1)
    """Requests in flight at once."""
    timeout_s: float = Field(60.0, gt=0)
    """Deadline of one request in seconds, from connecting to the last byte of the answer (not of each
    read: a server trickling bytes is cut off too); a timed-out request is retried."""
    retries: int = Field(3, ge=0)
    """Retries after a timeout, a connection error, HTTP 429 or 5xx (other 4xx answers are not retried)."""
    backoff_s: float = Field(1.0, ge=0)
    """First retry waits this long; each later one twice as long as the one before."""


class EndpointCaptioner(ChatEndpoint):
    """A vision-language model on an OpenAI-compatible chat-completions endpoint: frames in, a caption out."""

    frames: int = Field(16, ge=1, le=64)
    """Frames sent per clip as images, evenly spaced over the clip."""
    prompt: str = VCHITECT_PROMPT
    """The instruction sent after the frames (Vchitect-2.0's captioning prompt by default)."""
    image_max_side: int = Field(448, ge=32)
    """Frames are downscaled so their longer side is at most this many pixels before JPEG encoding."""
    jpeg_quality: int = Field(85, ge=10, le=100)
    """JPEG quality of the frames sent."""


class CaptionEnhance(ChatEndpoint):
    """A second pass (NeMo Curator's caption enhancement): a text model rewrites each clip's caption to the
    length and style asked for. The record keeps the first caption (`caption_original`) beside the new
    one (`caption`) and who wrote it (`caption_enhanced_by`); a clip whose rewrite fails is rejected
    (`error:enhance`, the reason in errors.jsonl) rather than kept with a caption of another style."""

    enabled: bool = False
    """Rewrite every caption (off: captions are as the captioner wrote them)."""
    model: str = "Qwen/Qwen2.5-14B-Instruct"
    """Text model sent in each request (the name the server serves)."""
    words: int = Field(80, ge=5)
    """Length asked for, in words (the `{words}` of the prompt)."""
    style: str = "one paragraph of plain present-tense prose, no lists, no speculation"
    """Style asked for (the `{style}` of the prompt)."""
    prompt: str = (
        "Rewrite this video caption in about {words} words, as {style}. Keep every fact it states, "
        "add detail only where it is implied, and answer with the caption alone.\n\nCaption: {caption}"
    )
    """The instruction; `{caption}`, `{words}` and `{style}` are filled in per clip."""

    @model_validator(mode="after")
    def _check_prompt_fields(self) -> CaptionEnhance:
        if "{caption}" not in self.prompt:
            raise ValueError("prompt must contain {caption} (where the clip's caption goes)")
        try:
            self.prompt.format(caption="", words=0, style="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"prompt may use only {{caption}}, {{words}} and {{style}} (write {{{{ for a brace): {err}"
            ) from None
        return self


class SidecarCaptioner(Section):
    """Captions that came with the source videos, mapped to clips by time overlap."""

    path: str | None = None
    """A CSV file `path,caption` (optionally with `start,end` columns in seconds) naming source videos;
    unset: a per-video JSON sidecar `[{start, end, text}]` next to each source video, named
    `<video>.captions.json` or `<video stem>.captions.json`."""
    min_overlap: float = Field(0.5, gt=0, le=1)
    """A segment captions a clip when it covers at least this fraction of the clip's duration; the
    segment with the largest overlap wins."""


class CaptionText(Section):
    """Cleaning of every caption, whichever backend made it."""

    max_chars: int = Field(600, ge=20)
    """Longer captions are cut at the last sentence end within this many characters (at a word
    boundary if no sentence ends in time); the record is flagged `caption_truncated`."""
    min_words: int = Field(3, ge=1)
    """Captions with fewer words are flagged empty."""
    max_repeats: int = Field(4, ge=2)
    """A caption in which a word or phrase (up to 4 words) repeats this many times in a row is degenerate."""
    max_token_share: float = Field(0.5, gt=0, le=1)
    """A caption of 8 words or more in which one word makes up more than this share is degenerate."""


class ClipModel(Section):
    """The open-clip model whose image and text towers score aesthetics and caption-video match."""

    model: str = "ViT-L-14"
    """open-clip model: a built-in name whose weights come from `checkpoint`, or `local-dir:/path`.
    The aesthetic head expects ViT-L/14 image embeddings (768 wide)."""
    checkpoint: str | None = None
    """Local open-clip checkpoint for a built-in `model` name (e.g. OpenAI's ViT-L-14 weights)."""
    frames: int = Field(4, ge=1, le=64)
    """Frames embedded per clip, evenly spaced; both the aesthetic score and the caption match average
    over them."""
    batch_size: int = Field(32, ge=1)
    """Images per forward pass of the image tower."""


class Aesthetic(Section):
    """The LAION aesthetic predictor (an MLP on normalised CLIP ViT-L/14 image embeddings, about 1-10)."""

    enabled: bool = True
    """Score aesthetics (and reject below `min_score`)."""
    head: str | None = None
    """Local weights of the MLP head (`.pth` state dict with `layers.*` keys as published by LAION,
    or `.safetensors`)."""
    min_score: float = 4.5
    """Clips scoring below this are rejected (`low_aesthetic`)."""


class Ocr(Section):
    """On-screen text with EasyOCR and Vchitect-2.0's rule."""

    enabled: bool = True
    """Detect text (and reject clips with text overlays)."""
    model_dir: str | None = None
    """Local EasyOCR model folder holding `craft_mlt_25k.pth` and the recogniser (`english_g2.pth` for
    `en`); loaded with downloads disabled."""
    languages: tuple[str, ...] = ("en",)
    """EasyOCR language codes; they pick the recogniser file."""
    frames: int = Field(4, ge=1, le=64)
    """Frames checked per clip, evenly spaced."""
    min_confidence: float = Field(0.4, ge=0, le=1)
    """Detections scoring below this are ignored."""
    min_chars: int = Field(4, ge=1)
    """Detections with shorter text are ignored."""
    texty_area: float = Field(0.02, ge=0, le=1)
    """A frame is texty when the kept detections' boxes cover more than this fraction of its area."""
    max_texty_frames: int = Field(1, ge=0)
    """Clips with more texty frames than this are rejected (`text_overlay`)."""


class Watermark(Section):
    """Vchitect-2.0's watermark filter: LAION's watermark classifier (EfficientNet-B3, timm) on each clip's
    first, middle and last frames."""

    enabled: bool = False
    """Score watermarks (and reject clips above `max_score`). Off by default: it needs the weights."""
    weights: str | None = None
    """Local LAION watermark model, the state dict file LAION publishes (`watermark_model_v1.pt`)."""
    frames: int = Field(3, ge=1, le=64)
    """Frames checked per clip, evenly spaced with both ends included: 3 = the first, middle and last, as
    Vchitect-2.0 checks them."""
    backbone: str = "efficientnet_b3"
    """timm model under LAION's head (LAION trained `efficientnet_b3a`, the same modules)."""
    max_score: float = Field(0.5, ge=0, le=1)
    """Clips whose highest frame probability of a watermark is above this are rejected (`watermark`);
    0.5 is the classifier's own decision (watermark more likely than clear)."""


class Motion(Section):
    """Dense optical flow on sampled pairs of consecutive frames: OpenCV Farneback (the CPU default) or
    torchvision's RAFT (Vchitect-2.0's motion estimate) from local weights."""

    enabled: bool = True
    """Score motion (and reject too static or too shaky clips)."""
    pairs: int = Field(4, ge=1, le=64)
    """Frame pairs per clip, evenly spaced; each pair is two consecutive frames."""
    size: int = Field(128, ge=16)
    """Frames are resized so their shorter side is this many pixels; scores are in pixels per frame at
    this size."""
    method: Literal["farneback", "raft_small", "raft_large"] = "farneback"
    """Flow estimator: OpenCV Farneback, or torchvision's `raft_small` / `raft_large` (12 refinement
    steps; a GPU's work, seconds a pair on a CPU)."""
    raft_weights: str | None = None
    """Local torchvision RAFT weights for `raft_*`: the state dict file torchvision's weight enums
    download (e.g. `raft_small_C_T_V2-01064c6d.pth`, `raft_large_C_T_SKHT_V2-ff5fadd5.pth`)."""
    min_score: float = Field(0.05, ge=0)
    """Clips whose mean flow magnitude is below this are rejected (`too_static`). Sensor grain alone
    measures about 0.03; a small object crossing a still frame at 1 px/frame about 0.1."""
    max_score: float = Field(12.0, gt=0)
    """Clips whose mean flow magnitude is above this are rejected (`too_shaky`)."""


class ClipScore(Section):
    """Caption-video match: cosine similarity of CLIP text and image embeddings, averaged over frames."""

    enabled: bool = True
    """Score the match (and reject below `min_score`)."""
    min_score: float = 0.18
    """Clips whose caption matches their frames less than this are rejected (`low_clip_score`)."""


class Caption(Section):
    """Settings of `vidforge caption` (captioner backend, quality annotations, keep/reject thresholds)."""

    backend: Literal["coca", "endpoint", "sidecar"] = "coca"
    """Who writes the captions: open-clip CoCa on keyframes, an OpenAI-compatible VLM endpoint, or the
    captions that came with the source videos."""
    fallback: Literal["coca", "endpoint"] | None = None
    """With `backend: sidecar`: who captions the clips that have no caption of their own (no sidecar for
    their source, or no segment covering them), as NeMo writes VLM captions only where none was provided.
    Unset: those clips are flagged `caption_empty` (or fail with `no caption sidecar`)."""
    coca: CocaCaptioner = CocaCaptioner()
    """The `coca` backend."""
    endpoint: EndpointCaptioner = EndpointCaptioner()
    """The `endpoint` backend."""
    sidecar: SidecarCaptioner = SidecarCaptioner()
    """The `sidecar` backend."""
    enhance: CaptionEnhance = CaptionEnhance()
    """Optional second pass rewriting each caption with a text endpoint (any backend's captions)."""
    text: CaptionText = CaptionText()
    """Caption cleaning and the empty/degenerate flags."""
    clip: ClipModel = ClipModel()
    """The CLIP model shared by the aesthetic score and the caption-video match."""
    aesthetic: Aesthetic = Aesthetic()
    """Aesthetic score and its threshold."""
    ocr: Ocr = Ocr()
    """On-screen text detection and its rule."""
    watermark: Watermark = Watermark()
    """Watermark classifier and its threshold."""
    motion: Motion = Motion()
    """Optical-flow motion score and its thresholds."""
    clip_score: ClipScore = ClipScore()
    """Caption-video CLIP similarity and its threshold."""
    reject_flagged_captions: bool = True
    """Reject clips whose caption is empty or degenerate (`caption_empty`, `caption_degenerate`)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where models run: `auto` picks CUDA when available."""
    random_weights: bool = False
    """Build models that have no weights path with random weights instead of refusing. Tests and demos
    only: the scores mean nothing, and every record says so (`random_weights: true`)."""
    batch_clips: int = Field(8, ge=1)
    """Clips annotated together (batched model calls span them); each clip is still its own unit of
    work, committed on its own."""
    decode_workers: int = Field(1, ge=0)
    """Processes decoding clips for the annotations in the local executor (the models run on one thread
    of the main process); 0 decodes in the main process. Ray balances its decode actors itself."""

    @model_validator(mode="after")
    def _check(self) -> Caption:
        if self.fallback is not None and self.backend != "sidecar":
            raise ValueError(
                f"fallback: captions clips that have none of their own, which only backend=sidecar leaves; "
                f"backend={self.backend} captions every clip: unset fallback or set backend=sidecar"
            )
        if self.motion.min_score >= self.motion.max_score:
            raise ValueError(
                f"motion.min_score ({self.motion.min_score}) must be below motion.max_score ({self.motion.max_score})"
            )
        return self
