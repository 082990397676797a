"""Fail-fast input checks of `vidforge caption` (`curate.captioning.checks` and each filter's `check`): each
wrong input the user gave is refused with the setting to change, by reading files only (shapes from
headers, as torch reads them); what only the libraries know (model names, EasyOCR's files) is refused by
the models' own setup, once, before any clip, naming the setting too."""

from __future__ import annotations

import json

import pytest
import torch

from vidforge.curate.captioning.annotator import CaptionAnnotator
from vidforge.curate.captioning.checks import check_endpoint_url, check_inputs
from vidforge.curate.filters.aesthetic import head_width
from vidforge.curate.filters.base import Resources, tensor_shapes
from vidforge.curate.filters.ocr import OcrFilter
from vidforge.curate.scorers.aesthetic import AestheticHead
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


def _clip_dir(tmp_path, name, **cfg):
    """A `local-dir:` open-clip folder holding only its config (random weights stand in)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    return f"local-dir:{folder}"


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["curation.caption.random_weights=false"], "curation.caption.clip.checkpoint"),
        (["curation.caption.clip.checkpoint=/no/such.bin"], "curation.caption.clip.checkpoint"),
        (["curation.caption.clip.model=local-dir:/no/such"], "open_clip_config.json"),
        (["curation.caption.aesthetic.head=/no/such.pth"], "curation.caption.aesthetic.head"),
        (["curation.caption.endpoint.url=localhost:8000/v1"], "curation.caption.endpoint.url"),
        (["curation.caption.ocr.enabled=true"], "curation.caption.ocr.model_dir"),
        (["curation.caption.ocr.enabled=true", "curation.caption.ocr.model_dir=/no/such"], "no such folder"),
        (["curation.caption.backend=sidecar", "curation.caption.sidecar.path=/no/such.csv"], "sidecar.path"),
    ],
)
def test_wrong_inputs_are_refused_naming_the_setting(sets, field):
    with pytest.raises(UserInputError, match=field.replace(".", r"\.")):
        check_inputs(_cfg(*sets), [])


def test_a_local_dir_coca_that_is_not_one_is_refused_from_its_config(tmp_path):
    model = _clip_dir(tmp_path, "clip", embed_dim=64)
    cfg = _cfg("curation.caption.backend=coca", f"curation.caption.coca.model={model}")
    with pytest.raises(UserInputError, match="curation.caption.coca.model: .* is not a CoCa model"):
        check_inputs(cfg, [])


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (
            ["curation.caption.clip.model=ViT-Nope"],
            r"curation\.caption\.clip\.model: unknown open-clip model",
        ),
        (
            ["curation.caption.backend=coca", "curation.caption.coca.model=tiny-clip"],
            r"curation\.caption\.coca\.model: tiny-clip is not a CoCa model",
        ),
        (["curation.caption.aesthetic.head=HEAD512"], "expects 512-wide CLIP embeddings but .* gives 768"),
    ],
)
def test_what_only_the_libraries_know_is_refused_by_setup(sets, match, tmp_path):
    """A built-in open-clip name's existence, kind and width are open-clip's: the models' setup refuses
    them (a one-line user error, before any clip is annotated)."""
    head = tmp_path / "head.pth"
    torch.save(AestheticHead(input_size=512).state_dict(), head)
    sets = [s.replace("HEAD512", str(head)) for s in sets]
    cfg = _cfg("curation.caption.backend=sidecar", *sets)
    with pytest.raises(UserInputError, match=match):
        CaptionAnnotator(cfg, tmp_path).setup()


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_head_width_is_read_from_the_header_as_torch_reads_it(tmp_path, suffix):
    head = AestheticHead(input_size=512)
    path = tmp_path / f"head{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(head.state_dict(), str(path))
    else:
        torch.save(head.state_dict(), path)
    reference = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert tensor_shapes(path) == reference
    assert head_width(str(path)) == 512
    clip = _clip_dir(tmp_path, "clip", embed_dim=768)
    with pytest.raises(UserInputError, match="512-wide CLIP embeddings but .* gives 768"):
        check_inputs(
            _cfg(f"curation.caption.aesthetic.head={path}", f"curation.caption.clip.model={clip}"), []
        )


def test_a_state_dict_that_is_not_a_head_is_refused(tmp_path):
    path = tmp_path / "other.pth"
    torch.save({"weight": torch.zeros(2, 3)}, path)
    with pytest.raises(UserInputError, match="not a LAION aesthetic head"):
        head_width(str(path))


def test_a_pickle_that_builds_other_objects_is_not_run(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"layers.0.weight": torch.zeros(4, 8), "x": torch.nn.Linear(2, 2)}, path)  # a whole module
    assert head_width(str(path)) is None  # torch's safe loader refused to build it; the loader decides


@pytest.mark.parametrize(("languages", "match"), [(["en"], "english_g2.pth"), (["xx"], r"ocr\.languages")])
def test_ocr_setup_names_what_easyocr_lacks(languages, match, tmp_path, monkeypatch):
    """EasyOCR's own Reader (downloads off, a detector file in place) decides which recogniser the
    languages need; the filter's setup turns its refusal into one line naming the setting."""
    import hashlib

    easyocr = pytest.importorskip("easyocr")
    craft = tmp_path / "craft_mlt_25k.pth"
    craft.write_bytes(b"stand-in detector")
    monkeypatch.setitem(
        easyocr.easyocr.detection_models["craft"], "md5sum", hashlib.md5(craft.read_bytes()).hexdigest()
    )
    settings = _cfg("curation.caption.ocr.enabled=true", f"curation.caption.ocr.model_dir={tmp_path}").ocr
    settings = settings.model_copy(update={"languages": tuple(languages)})
    with pytest.raises(UserInputError, match=match):
        OcrFilter(settings).setup(Resources("cpu", False))


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
