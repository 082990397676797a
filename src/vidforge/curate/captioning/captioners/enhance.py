"""Caption enhancement (NeMo Curator's second caption pass): a text model on an OpenAI-compatible
chat-completions endpoint rewrites each clip's caption to the length and style the profile asks for
(`curation.caption.enhance`). Whichever backend wrote the first caption; the annotator keeps it in the
record beside the rewrite. Requests go through the shared chat client (curate/captioning/chat.py) on a bounded
thread pool; a rewrite that fails is that clip's error and the clip keeps its first caption."""

from __future__ import annotations

import time
from typing import Any

from vidforge.curate.captioning.captioners import CaptionResult
from vidforge.curate.captioning.chat import ChatClient


def build_request(caption: str, settings: Any) -> dict[str, Any]:
    """The chat-completions body asking for `caption` rewritten (`settings`: curation.caption.enhance)."""
    prompt = settings.prompt.format(caption=caption, words=settings.words, style=settings.style)
    return {
        "model": settings.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
    }


class CaptionEnhancer:
    def __init__(self, settings: Any, sleep=time.sleep):
        self.settings = settings
        self.client = ChatClient(settings, "curation.caption.enhance", sleep)

    @property
    def source(self) -> str:
        return f"enhance:{self.settings.model}"

    def setup(self) -> None:
        self.client.setup()

    def close(self) -> None:
        self.client.close()

    def enhance(self, captions: list[str]) -> list[CaptionResult]:
        """One rewrite per caption, in order."""
        answers = self.client.answers(captions, lambda caption: build_request(caption, self.settings))
        return [
            CaptionResult(None if text is None else text.strip(), self.source, error=error)
            for text, error in answers
        ]
