"""Fail-fast checks of `vidforge caption`'s inputs, run before any model loads (diffusers' `check_inputs`).

Everything here reads files and settings only: no torch, open-clip or EasyOCR import (those take 5-15 s
to import on a small machine, and loading ViT-L-14 another 30 s), so a wrong profile is refused in about
a second. Checked: open-clip model names, checkpoints and `local-dir:` folders (CoCa must be a CoCa), the
aesthetic head's file and its input width against the CLIP model's embedding width, the EasyOCR folder
and the files the languages need, the endpoint URL, and the sidecar captions (the CSV, or the JSON next
to the source videos). Each failure is a `UserInputError` naming the setting to change.

What only loading can tell (a corrupt checkpoint, an EasyOCR file whose MD5 does not match, no CUDA)
is still refused by the models' own `setup`, once, before any clip is annotated."""

from __future__ import annotations

import ast
import importlib.util
import json
import pickle
import zipfile
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from vidforge.errors import UserInputError
from vidforge.profile.caption import Caption

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")  # as vidforge.curate.clip_score
RANDOM_HINT = "or set curation.caption.random_weights=true (tests and demos only)"


def check_inputs(cfg: Caption, records: Iterable[dict[str, Any]]) -> None:
    """Refuse (UserInputError) what would fail on the user's input; `cfg` is `curation.caption`, `records`
    the clip records about to be annotated (their sources locate sidecar captions)."""
    if cfg.backend == "coca":
        config = open_clip_config(
            cfg.coca.model, cfg.coca.checkpoint, cfg.random_weights, "curation.caption.coca"
        )
        if config is not None and "multimodal_cfg" not in config:
            raise UserInputError(
                f"curation.caption.coca.model: {cfg.coca.model} is not a CoCa model; use coca_ViT-L-14, "
                "coca_ViT-B-32 or a local-dir: CoCa folder"
            )
    elif cfg.backend == "endpoint":
        check_endpoint_url(cfg.endpoint.url)
    elif cfg.backend == "sidecar":
        check_sidecars(cfg.sidecar, records)
    if cfg.enhance.enabled:
        check_endpoint_url(cfg.enhance.url, "curation.caption.enhance.url")
    width = None
    if cfg.aesthetic.enabled or cfg.clip_score.enabled:
        config = open_clip_config(
            cfg.clip.model, cfg.clip.checkpoint, cfg.random_weights, "curation.caption.clip"
        )
        width = None if config is None else config.get("embed_dim")
    if cfg.aesthetic.enabled:
        head = head_width(cfg.aesthetic.head, cfg.random_weights)
        if head is not None and width is not None and head != width:
            raise UserInputError(
                f"curation.caption.aesthetic.head expects {head}-wide CLIP embeddings but "
                f"curation.caption.clip.model ({cfg.clip.model}) gives {width}; use ViT-L-14 for the LAION head"
            )
    if cfg.ocr.enabled:
        check_ocr_folder(cfg.ocr.model_dir, cfg.ocr.languages)
    if cfg.watermark.enabled:
        check_weights_file(cfg.watermark.weights, cfg.random_weights, "curation.caption.watermark.weights")
    if cfg.motion.enabled and cfg.motion.method != "farneback":
        check_weights_file(cfg.motion.raft_weights, False, "curation.caption.motion.raft_weights")


def check_weights_file(path: str | None, random_weights: bool, field: str) -> None:
    """A model's local weights file is named and there (random weights stand in only where allowed)."""
    if path is None and not random_weights:
        raise UserInputError(
            f"{field}: give the local weights file (nothing is downloaded), or turn this step off"
        )
    if path is not None and not Path(path).is_file():
        raise UserInputError(f"{field}: no such file {path}")


# -- open-clip -----------------------------------------------------------------------------------------
def open_clip_config(model: str, checkpoint: str | None, random_weights: bool, field: str) -> dict | None:
    """The model config an open-clip name or `local-dir:` folder stands for, after checking its weights
    are there (or random weights are allowed), as `clip_score.load_open_clip` will. None when the config
    cannot be read without importing open-clip (the loader then decides)."""
    if model.startswith("local-dir:"):
        folder = Path(model.removeprefix("local-dir:"))
        config_file = folder / "open_clip_config.json"
        if not config_file.is_file():
            raise UserInputError(
                f"{field}.model: {folder} has no open_clip_config.json; give an open-clip model folder"
            )
        if not random_weights and not any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir()):
            raise UserInputError(f"{field}.model: {folder} has no weights file; add one, {RANDOM_HINT}")
        try:
            data = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise UserInputError(f"{field}.model: {config_file} is not JSON ({err})") from None
        return data.get("model_cfg", data) if isinstance(data, dict) else None
    configs = builtin_configs()
    if configs and model not in configs:
        raise UserInputError(
            f"{field}.model: unknown open-clip model {model!r}; use a built-in name or local-dir:PATH"
        )
    if checkpoint:
        if not Path(checkpoint).is_file():
            raise UserInputError(f"{field}.checkpoint: no such file {checkpoint}")
    elif not random_weights:
        raise UserInputError(
            f"{field}.checkpoint: no weights for {model}; give a local open-clip checkpoint or a local-dir: model "
            f"(nothing is downloaded), {RANDOM_HINT}"
        )
    return configs.get(model)


@lru_cache(maxsize=1)
def builtin_configs() -> dict[str, dict]:
    """{name: config} of open-clip's bundled model configs (its `model_configs/*.json`, read without
    importing it) and vidforge's tiny test configs. Empty when open-clip is not installed."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        return {}
    configs: dict[str, dict] = {}
    for path in sorted(Path(next(iter(spec.submodule_search_locations)), "model_configs").glob("*.json")):
        try:
            configs[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    configs.update(_tiny_configs())
    return configs


def _tiny_configs() -> dict[str, dict]:
    """`clip_score.TINY_CONFIGS`, read as the literal it is from the module's source: importing that module
    imports torch (seconds). Falls back to the import if the literal cannot be read."""
    spec = importlib.util.find_spec("vidforge.curate.clip_score")
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        for node in tree.body:
            target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
            if getattr(target, "id", None) == "TINY_CONFIGS" and node.value is not None:
                return ast.literal_eval(node.value)
    except (OSError, ValueError, SyntaxError, TypeError, AttributeError):
        pass
    from vidforge.curate.clip_score import TINY_CONFIGS

    return TINY_CONFIGS


# -- aesthetic head ------------------------------------------------------------------------------------
def head_width(path: str | None, random_weights: bool) -> int | None:
    """The input width of the aesthetic head at `path` (768 for the random head); None when it cannot be
    read without torch (the loader checks it)."""
    if path is None:
        if not random_weights:
            raise UserInputError(
                "curation.caption.aesthetic.head: give the local LAION aesthetic head (e.g. "
                "sac+logos+ava1-l14-linearMSE.pth), set curation.caption.aesthetic.enabled=false, "
                f"{RANDOM_HINT}"
            )
        return 768  # AestheticHead's default
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"curation.caption.aesthetic.head: no such file {file}")
    shapes = tensor_shapes(file)
    if shapes is None:
        return None
    first = shapes.get("layers.0.weight")
    if first is None or len(first) != 2:
        raise UserInputError(
            f"curation.caption.aesthetic.head: {file} is not a LAION aesthetic head (no layers.0.weight)"
        )
    return int(first[1])


def tensor_shapes(file: Path) -> dict[str, tuple[int, ...]] | None:
    """{key: shape} of a state dict in a `.safetensors` file or a zip-format `torch.save` file, read
    without torch. None for formats this cannot read (the legacy torch format)."""
    try:
        if file.suffix == ".safetensors":
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
        if not zipfile.is_zipfile(file):
            return None
        with zipfile.ZipFile(file) as z:
            name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
            if name is None:
                return None
            state = _ShapeUnpickler(z.open(name)).load()
    except (OSError, ValueError, KeyError, pickle.UnpicklingError, EOFError):
        return None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        return None
    return {str(k): v.shape for k, v in state.items() if isinstance(v, _Shape)}


class _Shape:
    def __init__(self, shape):
        self.shape = tuple(int(x) for x in shape)


def _rebuild_tensor(storage, offset, size, *args, **kwargs):
    return _Shape(size)


def _rebuild_parameter(data, *args, **kwargs):
    return data


class _ShapeUnpickler(pickle.Unpickler):
    """Unpickles torch's data.pkl into {key: _Shape}: tensors become their sizes, storages nothing, and no
    class outside a short list is ever built (so a hostile file runs no code)."""

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            from collections import OrderedDict

            return OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name.endswith("Storage"):
            return object
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain state dict")

    def persistent_load(self, pid):
        return None


# -- OCR -----------------------------------------------------------------------------------------------
def check_ocr_folder(model_dir: str | None, languages: Iterable[str]) -> None:
    """The EasyOCR folder exists and holds the detector and the recogniser these languages need."""
    if not model_dir:
        raise UserInputError(
            "curation.caption.ocr.model_dir: give a local EasyOCR model folder (craft_mlt_25k.pth and the "
            "recogniser, e.g. english_g2.pth), or set curation.caption.ocr.enabled=false"
        )
    folder = Path(model_dir)
    if not folder.is_dir():
        raise UserInputError(f"curation.caption.ocr.model_dir: no such folder {folder}")
    config = _easyocr_config()
    if config is None:
        return
    languages = list(languages)
    unknown = sorted(set(languages) - set(config.all_lang_list))
    if unknown:
        raise UserInputError(f"curation.caption.ocr.languages: EasyOCR has no {unknown}")
    needed = [config.detection_models["craft"]["filename"], recogniser_file(languages, config)]
    missing = [n for n in needed if not (folder / n).is_file()]
    if missing:
        raise UserInputError(
            f"curation.caption.ocr.model_dir: {folder} lacks {', '.join(missing)}; put EasyOCR's model files "
            "there (nothing is downloaded), or set curation.caption.ocr.enabled=false"
        )


def recogniser_file(languages: list[str], config: Any) -> str:
    """The recogniser file EasyOCR's `Reader` picks for `languages` (its `recog_network='standard'` rule)."""
    gen1, gen2 = config.recognition_models["gen1"], config.recognition_models["gen2"]
    langs = set(languages)
    if languages == ["en"]:
        return gen2["english_g2"]["filename"]
    for code, table, key in (
        ("th", gen1, "thai_g1"),
        ("ch_tra", gen1, "zh_tra_g1"),
        ("ch_sim", gen2, "zh_sim_g2"),
        ("ja", gen2, "japanese_g2"),
        ("ko", gen2, "korean_g2"),
        ("ta", gen1, "tamil_g1"),
        ("te", gen2, "telugu_g2"),
        ("kn", gen2, "kannada_g2"),
    ):
        if code in langs:
            return table[key]["filename"]
    for family, table, key in (
        (config.bengali_lang_list, gen1, "bengali_g1"),
        (config.arabic_lang_list, gen1, "arabic_g1"),
        (config.devanagari_lang_list, gen1, "devanagari_g1"),
        (config.cyrillic_lang_list, gen2, "cyrillic_g2"),
    ):
        if langs & set(family):
            return table[key]["filename"]
    return gen2["latin_g2"]["filename"]


def _easyocr_config():
    """`easyocr.config` (file names and language lists) without importing easyocr (which imports torch)."""
    import sys

    if "easyocr.config" in sys.modules:
        return sys.modules["easyocr.config"]
    spec = importlib.util.find_spec("easyocr")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), "config.py")
    loader_spec = importlib.util.spec_from_file_location("_vidforge_easyocr_config", path)
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - an unexpected easyocr layout: leave the check to the loader
        return None
    return module


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


def check_sidecars(settings: Any, records: Iterable[dict[str, Any]]) -> None:
    """The CSV reads with its columns; or, for JSON sidecars, every one next to a source reads, and at
    least one source has one (a source without one only fails its own clips)."""
    from vidforge.curate.captioners.sidecar import SIDECAR_SUFFIX, read_csv_captions, read_json_sidecar

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
                except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                    raise UserInputError(
                        f"sidecar captions {candidate}: expected a JSON list of {{start, end, text}} ({err}); "
                        "fix or remove the file"
                    ) from None
                found += 1
                break
    if not found:
        raise UserInputError(
            f"curation.caption.backend=sidecar: none of the {len(sources)} source videos has a "
            f"<video>{SIDECAR_SUFFIX} next to it (e.g. {sources[0]}); set curation.caption.sidecar.path to a CSV"
        )
