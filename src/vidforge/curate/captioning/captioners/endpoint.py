"""Captions from an OpenAI-compatible chat-completions endpoint serving a vision-language model (vLLM,
SGLang and the like): N evenly spaced frames go as JPEG data-URL images, followed by the prompt.

Requests run on a bounded thread pool (`concurrency`) through the shared chat client (curate/captioning/chat.py:
timeouts, retries, the API key sent to the configured origin only and never recorded); a request that
fails for good is that clip's error."""

from __future__ import annotations

import base64
import time
from typing import Any

import cv2
import numpy as np

from vidforge.curate.captioning.captioners import CaptionResult, ClipItem
from vidforge.curate.captioning.chat import ChatClient


def encode_jpeg_data_url(frame: np.ndarray, max_side: int, quality: int) -> str:
    """An RGB uint8 frame as a `data:image/jpeg;base64,...` URL, downscaled to `max_side` if larger."""
    h, w = frame.shape[:2]
    scale = max_side / max(h, w)
    if scale < 1:
        frame = cv2.resize(
            frame, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
        )
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise ValueError("JPEG encoding failed")
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")


def build_request(frames: np.ndarray, settings: Any) -> dict[str, Any]:
    """The chat-completions body: one user message with the frames as images, then the prompt."""
    content: list[dict[str, Any]] = [
        {
            "type": "image_url",
            "image_url": {"url": encode_jpeg_data_url(f, settings.image_max_side, settings.jpeg_quality)},
        }
        for f in frames
    ]
    content.append({"type": "text", "text": settings.prompt})
    return {
        "model": settings.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
    }


class EndpointCaptioner:
    name = "endpoint"

    def __init__(self, settings: Any, sleep=time.sleep):
        self.settings = settings
        self.frames = settings.frames
        self.client = ChatClient(settings, "curation.caption.endpoint", sleep)

    @property
    def source(self) -> str:
        return f"endpoint:{self.settings.model}"

    def setup(self) -> None:
        self.client.setup()

    def close(self) -> None:
        self.client.close()

    def caption(self, items: list[ClipItem]) -> list[CaptionResult]:
        answers = self.client.answers(
            items, lambda item: build_request(item.sample(self.frames), self.settings)
        )
        return [CaptionResult(text, self.source, error=error) for text, error in answers]
