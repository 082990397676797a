"""Fail-fast checks of `vidforge caption`'s inputs, run before any model loads (diffusers' `check_inputs`).

They check what the user gave, reading files only (no open-clip or EasyOCR import, and torch only to
read a `.pth` file's shapes with its safe loader: those imports take 5-15 s on a small machine, and
loading ViT-L-14 another 30 s), so a wrong profile is refused in about a second: weights files and
`local-dir:` folders exist (a `local-dir:` CoCa is a CoCa), shapes read from file headers agree, the
endpoint URLs, the sidecar captions (the CSV, or the JSON next to the source videos), and each enabled
filter's own `check` (`curate.filters`). Each failure is a `UserInputError` naming the setting to change.

What only the libraries know (an open-clip model name, the EasyOCR files a language needs, a corrupt
checkpoint, no CUDA) is refused by each model's own `setup`, once, before any clip is annotated."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vidforge.curate import filters
from vidforge.curate.filters.base import open_clip_config
from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption


def check_inputs(cfg: Caption, records: Iterable[dict[str, Any]]) -> None:
    """Refuse (UserInputError) what would fail on the user's input; `cfg` is `curation.caption`, `records`
    the clip records about to be annotated (their sources locate sidecar captions)."""
    backends = {cfg.backend, cfg.fallback} - {None}
    if "coca" in backends:
        config = open_clip_config(
            cfg.coca.model, cfg.coca.checkpoint, cfg.random_weights, "curation.caption.coca"
        )
        if config is not None and "multimodal_cfg" not in config:
            raise UserInputError(
                f"curation.caption.coca.model: {cfg.coca.model} is not a CoCa model; use coca_ViT-L-14, "
                "coca_ViT-B-32 or a local-dir: CoCa folder"
            )
    if "endpoint" in backends:
        check_endpoint_url(cfg.endpoint.url)
    if "sidecar" in backends:
        # with a fallback, sources without captions are what it is for: only unreadable sidecars stop the run
        check_sidecars(cfg.sidecar, records, some_required=cfg.fallback is None)
    if cfg.enhance.enabled:
        check_endpoint_url(cfg.enhance.url, "curation.caption.enhance.url")
    scorers = filters.enabled(cfg)
    if any(s.uses_clip for s in scorers):
        open_clip_config(cfg.clip.model, cfg.clip.checkpoint, cfg.random_weights, "curation.caption.clip")
    for scorer in scorers:
        scorer.check(cfg)


# -- endpoint and sidecars -----------------------------------------------------------------------------
def check_endpoint_url(url: str, field: str = "curation.caption.endpoint.url") -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserInputError(
            f"{field} must be http(s)://host[:port]/path (e.g. http://127.0.0.1:8000/v1), got {url!r}"
        )
    if parsed.path.rstrip("/").endswith("/chat/completions"):
        raise UserInputError(
            f"{field}: give the base URL without /chat/completions (it is added), got {url!r}"
        )


def check_sidecars(settings: Any, records: Iterable[dict[str, Any]], some_required: bool = True) -> None:
    """The CSV reads with its columns; or, for JSON sidecars, every one next to a source reads, and (when
    `some_required`: no fallback captioner) at least one source has one (a source without one only fails
    its own clips)."""
    from vidforge.curate.captioning.captioners.sidecar import (
        SIDECAR_SUFFIX,
        read_csv_captions,
        read_json_sidecar,
    )

    if settings.path:
        path = Path(settings.path)
        if not path.is_file():
            raise UserInputError(
                f"curation.caption.sidecar.path: no such file {path}; give a CSV path,caption"
            )
        try:
            read_csv_captions(path)
        except UserInputError:
            raise
        except (ValueError, KeyError, UnicodeDecodeError) as err:
            raise UserInputError(
                f"curation.caption.sidecar.path: {path} does not read as CSV ({err})"
            ) from None
        return
    sources = sorted({str(r.get("source") or "") for r in records} - {""})
    if not sources:
        return
    found = 0
    for source in sources:
        src = Path(source)
        for candidate in (src.with_name(src.name + SIDECAR_SUFFIX), src.with_suffix(SIDECAR_SUFFIX)):
            if candidate.is_file():
                try:
                    read_json_sidecar(candidate)
                except UserInputError:  # already one line naming the file (a link out, not UTF-8)
                    raise
                except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                    raise UserInputError(
                        f"sidecar captions {candidate}: expected a JSON list of {{start, end, text}} ({err}); "
                        "fix or remove the file"
                    ) from None
                found += 1
                break
    if not found and some_required:
        raise UserInputError(
            f"curation.caption.backend=sidecar: none of the {len(sources)} source videos has a "
            f"<video>{SIDECAR_SUFFIX} next to it (e.g. {sources[0]}); set curation.caption.sidecar.path to a CSV"
        )
