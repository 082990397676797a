"""On-screen text: Vchitect-2.0's rule decided on detector outputs (texty vs clean frames), and EasyOCR's
real loader and reader running on random-weight CRAFT and recogniser files written in EasyOCR's format."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from vidforge.curate.scorers.ocr import Detection, EasyOcrDetector, TextRule, covered_fraction, judge_text
from vidforge.errors import UserInputError

H, W = 100, 200


def _box(x0, y0, x1, y1):
    return ((x0, y0), (x1, y0), (x1, y1), (x0, y1))


def test_covered_fraction_is_the_union_of_boxes():
    # Two overlapping 20x10 boxes: union = 20*10 + 20*10 - 10*10 = 300 pixels (inclusive corners add a row/col).
    frac = covered_fraction([_box(0, 0, 19, 9), _box(10, 0, 29, 9)], H, W)
    assert frac == pytest.approx(30 * 10 / (H * W))
    assert covered_fraction([], H, W) == 0.0


def test_text_rule_on_detector_outputs():
    rule = TextRule()  # 0.4 confidence, 4 characters, 2% of the area, more than one texty frame rejects
    big = _box(10, 10, 109, 29)  # 100 x 20 = 10% of the frame
    small = _box(0, 0, 9, 9)  # 100 px = 0.5%
    texty = [Detection(big, "SALE NOW", 0.9)]
    clean_frames = [
        [],
        [Detection(big, "SALE NOW", 0.3)],  # low confidence: ignored
        [Detection(big, "ABC", 0.99)],  # too short: ignored
        [Detection(small, "tiny text", 0.9)],  # kept but covers 0.5% only
    ]
    verdict = judge_text(clean_frames, [(H, W)] * 4, rule)
    assert verdict.texty_frames == 0 and not verdict.reject
    assert verdict.text_area == pytest.approx(100 / (H * W))
    one = judge_text([texty, [], [], []], [(H, W)] * 4, rule)
    assert one.texty_frames == 1 and not one.reject  # one texty frame is allowed
    two = judge_text([texty, [], texty, []], [(H, W)] * 4, rule)
    assert two.texty_frames == 2 and two.reject
    assert two.text_area == pytest.approx(100 * 20 / (H * W))
    # Exactly at the area threshold is not texty ("more than 2%"): 20 x 20 = 400 px = 2%.
    edge = [Detection(_box(0, 0, 19, 19), "abcd", 0.5)]
    assert judge_text([edge, edge], [(H, W)] * 2, rule).texty_frames == 0


@pytest.fixture(scope="module")
def easyocr_dirs(tmp_path_factory):
    """Two EasyOCR model folders with random weights: one whose CRAFT sees text everywhere, one nowhere.
    The recogniser is biased to read 'A' at every step (CTC collapses it to one character)."""
    import easyocr.config as cfg
    from easyocr.craft import CRAFT
    from easyocr.model.vgg_model import Model
    from easyocr.utils import CTCLabelConverter

    torch.manual_seed(0)
    rec_info = cfg.recognition_models["gen2"]["english_g2"]
    converter = CTCLabelConverter(rec_info["characters"], {}, {})
    recogniser = Model(
        input_channel=1, output_channel=256, hidden_size=256, num_class=len(converter.character)
    )
    with torch.no_grad():
        recogniser.Prediction.weight.zero_()
        recogniser.Prediction.bias.fill_(-10.0)
        recogniser.Prediction.bias[converter.dict["A"]] = 10.0
    rec_state = {f"module.{k}": v for k, v in recogniser.state_dict().items()}
    folders = {}
    for name, bias in (("texty", 5.0), ("clean", -5.0)):
        folder = tmp_path_factory.mktemp(f"easyocr_{name}")
        craft = CRAFT(pretrained=False)
        with torch.no_grad():
            craft.conv_cls[-1].weight.zero_()
            craft.conv_cls[-1].bias.fill_(bias)
        torch.save(craft.state_dict(), folder / cfg.detection_models["craft"]["filename"])
        torch.save(rec_state, folder / rec_info["filename"])
        folders[name] = folder
    return folders


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _register(monkeypatch, folder):
    import easyocr.config as cfg

    monkeypatch.setitem(cfg.detection_models["craft"], "md5sum", _md5(folder / "craft_mlt_25k.pth"))
    monkeypatch.setitem(
        cfg.recognition_models["gen2"]["english_g2"], "md5sum", _md5(folder / "english_g2.pth")
    )


@pytest.mark.slow
def test_easyocr_runs_on_random_weight_models(easyocr_dirs, monkeypatch):
    frames = np.random.default_rng(0).integers(0, 256, (2, 96, 128, 3), dtype=np.uint8)
    _register(monkeypatch, easyocr_dirs["texty"])
    texty = EasyOcrDetector(str(easyocr_dirs["texty"]))
    detections = texty.detect_many(frames)
    assert all(len(d) >= 1 for d in detections)
    assert all(det.text == "A" and det.score > 0.9 for d in detections for det in d)
    rule = TextRule(min_chars=1)
    verdict = judge_text(detections, [(96, 128)] * 2, rule)
    assert verdict.texty_frames == 2 and verdict.reject and verdict.text_area > 0.5
    # Vchitect's 4-character minimum ignores one-letter readings.
    assert judge_text(detections, [(96, 128)] * 2, TextRule()).texty_frames == 0

    _register(monkeypatch, easyocr_dirs["clean"])
    clean = EasyOcrDetector(str(easyocr_dirs["clean"]))
    assert clean.detect_many(frames) == [[], []]


def test_easyocr_refuses_without_models(tmp_path, easyocr_dirs):
    with pytest.raises(UserInputError, match="ocr.model_dir"):
        EasyOcrDetector(None).setup()
    with pytest.raises(UserInputError, match="MD5 mismatch|Missing"):
        EasyOcrDetector(str(easyocr_dirs["clean"])).setup()  # the real table's hashes do not match
