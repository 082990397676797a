"""Fail-fast input checks of `vidforge caption` (`curate.caption_checks`): each wrong input is refused
with the setting to change, by reading files only, and agrees with what the real loaders read."""

from __future__ import annotations

import json

import pytest
import torch

from vidforge.curate.aesthetic import AestheticHead
from vidforge.curate.caption_checks import (
    _easyocr_config,
    check_endpoint_url,
    check_inputs,
    check_ocr_folder,
    head_width,
    recogniser_file,
    tensor_shapes,
)
from vidforge.errors import UserInputError
from vidforge.profile import load_profile

BASE = [
    "curation.caption.backend=endpoint",
    "curation.caption.random_weights=true",
    "curation.caption.clip.model=tiny-clip",
    "curation.caption.ocr.enabled=false",
    "curation.caption.aesthetic.enabled=true",
    "curation.caption.clip_score.enabled=true",
]


def _cfg(*sets):
    return load_profile(None, [*BASE, *sets]).curation.caption


def test_a_good_profile_passes():
    check_inputs(_cfg(), [])


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["curation.caption.clip.model=ViT-Nope"], "curation.caption.clip.model"),
        (["curation.caption.random_weights=false"], "curation.caption.clip.checkpoint"),
        (["curation.caption.clip.checkpoint=/no/such.bin"], "curation.caption.clip.checkpoint"),
        (["curation.caption.clip.model=local-dir:/no/such"], "open_clip_config.json"),
        (["curation.caption.backend=coca", "curation.caption.coca.model=ViT-B-32"], "not a CoCa model"),
        (["curation.caption.aesthetic.head=/no/such.pth"], "curation.caption.aesthetic.head"),
        (["curation.caption.clip.model=ViT-B-32"], "512"),  # the random 768-wide head vs a 512-wide CLIP
        (["curation.caption.endpoint.url=localhost:8000/v1"], "curation.caption.endpoint.url"),
        (["curation.caption.ocr.enabled=true"], "curation.caption.ocr.model_dir"),
        (["curation.caption.backend=sidecar", "curation.caption.sidecar.path=/no/such.csv"], "sidecar.path"),
    ],
)
def test_wrong_inputs_are_refused_naming_the_setting(sets, field):
    with pytest.raises(UserInputError, match=field.replace(".", r"\.")):
        check_inputs(_cfg(*sets), [])


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_head_width_is_read_without_torch_as_torch_reads_it(tmp_path, suffix):
    head = AestheticHead(input_size=512)
    path = tmp_path / f"head{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(head.state_dict(), str(path))
    else:
        torch.save(head.state_dict(), path)
    reference = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert tensor_shapes(path) == reference
    assert head_width(str(path), random_weights=False) == 512
    with pytest.raises(UserInputError, match="512-wide CLIP embeddings but .* gives 768"):
        check_inputs(_cfg(f"curation.caption.aesthetic.head={path}"), [])


def test_a_state_dict_that_is_not_a_head_is_refused(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"weight": torch.zeros(2, 3)}, path)
    with pytest.raises(UserInputError, match="not a LAION aesthetic head"):
        head_width(str(path), random_weights=False)


def test_a_pickle_that_builds_other_objects_is_not_run(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"layers.0.weight": torch.zeros(4, 8), "x": torch.nn.Linear(2, 2)}, path)  # a whole module
    assert tensor_shapes(path) is None  # refused to build it; the loader decides (weights_only)


def test_ocr_folder_needs_the_detector_and_the_languages_recogniser(tmp_path):
    with pytest.raises(UserInputError, match="no such folder"):
        check_ocr_folder(str(tmp_path / "missing"), ["en"])
    with pytest.raises(UserInputError, match="craft_mlt_25k.pth, english_g2.pth"):
        check_ocr_folder(str(tmp_path), ["en"])
    (tmp_path / "craft_mlt_25k.pth").write_bytes(b"x")
    (tmp_path / "english_g2.pth").write_bytes(b"x")
    check_ocr_folder(str(tmp_path), ["en"])
    with pytest.raises(UserInputError, match="latin_g2.pth"):
        check_ocr_folder(str(tmp_path), ["en", "fr"])
    with pytest.raises(UserInputError, match="no \\['xx'\\]"):
        check_ocr_folder(str(tmp_path), ["xx"])


@pytest.mark.parametrize(
    "languages", [["en"], ["fr", "en"], ["ch_sim", "en"], ["ru", "en"], ["th", "en"], ["hi", "en"], ["ar"]]
)
def test_recogniser_choice_matches_easyocr(languages, tmp_path, monkeypatch):
    """EasyOCR's own Reader, with downloads off, a detector file in place and no recogniser, names the
    recogniser file it wants."""
    import hashlib

    easyocr = pytest.importorskip("easyocr")
    craft = tmp_path / "craft_mlt_25k.pth"
    craft.write_bytes(b"stand-in detector")
    monkeypatch.setitem(
        easyocr.easyocr.detection_models["craft"], "md5sum", hashlib.md5(craft.read_bytes()).hexdigest()
    )
    with pytest.raises(FileNotFoundError) as missing:
        easyocr.Reader(
            languages,
            gpu=False,
            model_storage_directory=str(tmp_path),
            user_network_directory=str(tmp_path),
            download_enabled=False,
            verbose=False,
        )
    wanted = recogniser_file(languages, _easyocr_config())
    assert str(missing.value) == f"Missing {tmp_path / wanted} and downloads disabled"


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:8000/v1", True),
        ("https://vlm.example.org/v1/", True),
        ("127.0.0.1:8000", False),
        ("ftp://x/v1", False),
        ("http:///v1", False),
        ("http://h:8000/v1/chat/completions", False),
    ],
)
def test_endpoint_url_form(url, ok):
    if ok:
        check_endpoint_url(url)
    else:
        with pytest.raises(UserInputError, match="endpoint.url"):
            check_endpoint_url(url)


def test_sidecars_are_read_before_work(tmp_path):
    cfg = _cfg("curation.caption.backend=sidecar")
    video = tmp_path / "a.mp4"
    video.write_bytes(b"")
    records = [{"clip_id": "c", "source": str(video), "start_s": 0, "end_s": 1}]
    with pytest.raises(UserInputError, match="none of the 1 source videos"):
        check_inputs(cfg, records)
    (tmp_path / "a.mp4.captions.json").write_text('{"not": "a list"}')
    with pytest.raises(UserInputError, match="a.mp4.captions.json"):
        check_inputs(cfg, records)
    (tmp_path / "a.mp4.captions.json").write_text(json.dumps([{"start": 0, "end": 1, "text": "x"}]))
    check_inputs(cfg, records)
    csv = tmp_path / "captions.csv"
    csv.write_text("video,text\na.mp4,x\n")
    with pytest.raises(UserInputError, match="path,caption"):
        check_inputs(
            _cfg("curation.caption.backend=sidecar", f"curation.caption.sidecar.path={csv}"), records
        )
