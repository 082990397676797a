"""Caption cleaning, whichever backend wrote the caption: whitespace, length cut at a sentence boundary,
and flags for empty and degenerate (looping) captions."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_WORD = re.compile(r"[\w']+")

TRUNCATED, EMPTY, DEGENERATE = "caption_truncated", "caption_empty", "caption_degenerate"


@dataclass(frozen=True)
class CleanedCaption:
    text: str
    flags: list[str] = field(default_factory=list)


def cut_at_sentence(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` shortened to at most `max_chars` characters, ending at the last sentence end (., ! or ?
    followed by a space or the end) inside the limit; at a word boundary when no sentence ends in time.
    Returns the text and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    head = text[: max_chars + 1]  # one more, so a sentence end exactly at the limit is seen
    ends = [m.end() for m in _SENTENCE_END.finditer(head) if m.end() <= max_chars]
    if ends:
        return text[: ends[-1]].rstrip(), True
    space = text.rfind(" ", 0, max_chars + 1)
    return (text[:space] if space > 0 else text[:max_chars]).rstrip(" ,;:-"), True


def longest_run(words: list[str], max_ngram: int = 4) -> int:
    """The most times any phrase of 1 to `max_ngram` words repeats back to back in `words`."""
    best = 1 if words else 0
    for n in range(1, max_ngram + 1):
        for start in range(len(words) - n + 1):
            phrase, run, pos = words[start : start + n], 1, start + n
            while words[pos : pos + n] == phrase:
                run, pos = run + 1, pos + n
            best = max(best, run)
    return best


def degenerate(words: list[str], max_repeats: int, max_token_share: float) -> bool:
    """A token or short phrase looping (`max_repeats` times in a row), or one word dominating a caption
    of 8 words or more."""
    if longest_run(words) >= max_repeats:
        return True
    if len(words) >= 8:
        _, count = Counter(words).most_common(1)[0]
        return count / len(words) > max_token_share
    return False


def clean_caption(
    text: str | None,
    *,
    max_chars: int = 600,
    min_words: int = 3,
    max_repeats: int = 4,
    max_token_share: float = 0.5,
) -> CleanedCaption:
    """Normalise whitespace, cut over-long captions at a sentence boundary, flag empty and degenerate ones."""
    text = " ".join((text or "").split())
    flags: list[str] = []
    text, cut = cut_at_sentence(text, max_chars)
    if cut:
        flags.append(TRUNCATED)
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < min_words:
        flags.append(EMPTY)
    elif degenerate(words, max_repeats, max_token_share):
        flags.append(DEGENERATE)
    return CleanedCaption(text, flags)
