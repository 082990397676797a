"""Vchitect-2.0's filters: LAION's watermark classifier and torchvision's RAFT motion, each on random weights
saved in the real on-disk format (a state dict file, as LAION publishes its model and torchvision's weight
enums download RAFT's) and loaded through the real loader; compared with the same network run the way its
authors' code runs it (LAION's torchvision transforms on PIL images; torchvision's OpticalFlow preset).
Then both in `vidforge caption`, and the Vchitect-2.0 profile."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from vidforge.errors import UserInputError
from vidforge.profile import load_profile


def _frames(n: int, h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h // 8, w // 8, 3)).astype(np.uint8)
    frames = np.repeat(np.repeat(base, 8, 0), 8, 1)[None].repeat(n, 0)
    for i in range(n):  # a block pattern sliding right 2 px a frame
        frames[i] = np.roll(frames[i], 2 * i, axis=1)
    return frames


@pytest.fixture(scope="module")
def laion_watermark_file(tmp_path_factory):
    """LAION's watermark model as their example_use.py builds it, random weights, saved as they publish."""
    import timm

    torch.manual_seed(3)
    model = timm.create_model("efficientnet_b3", pretrained=False, num_classes=2)
    model.classifier = nn.Sequential(
        nn.Linear(in_features=1536, out_features=625),
        nn.ReLU(),
        nn.Dropout(p=0.3),
        nn.Linear(in_features=625, out_features=256),
        nn.ReLU(),
        nn.Linear(in_features=256, out_features=2),
    )
    with torch.no_grad():  # running statistics away from the identity, so the loader must carry them
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("watermark") / "watermark_model_v1.pt"
    torch.save(model.state_dict(), path)
    return path, model.eval()


def test_watermark_classifier_loads_laions_file_and_scores_as_laions_code(laion_watermark_file):
    from PIL import Image
    from torchvision import transforms as T

    from vidforge.curate.scorers.watermark import WatermarkClassifier

    path, reference = laion_watermark_file
    settings = load_profile(None, [f"curation.caption.watermark.weights={path}"]).curation.caption.watermark
    classifier = WatermarkClassifier(settings)
    frames = _frames(2, 320, 320, seed=0)
    ours = classifier.probabilities(frames)
    assert not classifier.random_weights
    laion = T.Compose(
        [T.Resize((256, 256)), T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    )
    batch = torch.stack([laion(Image.fromarray(f)) for f in frames])
    with torch.no_grad():
        expected = torch.softmax(reference(batch), dim=1)[:, 0].numpy()
    np.testing.assert_allclose(ours, expected, atol=2e-3)
    assert classifier.score_clip(frames) == pytest.approx(float(expected.max()), abs=2e-3)


def test_watermark_file_of_another_model_is_one_line_user_error(tmp_path):
    from vidforge.curate.scorers.watermark import WatermarkClassifier

    wrong = tmp_path / "aesthetic.pth"
    torch.save({"layers.0.weight": torch.zeros(2, 2)}, wrong)
    settings = load_profile(None, [f"curation.caption.watermark.weights={wrong}"]).curation.caption.watermark
    with pytest.raises(UserInputError, match="is not a LAION watermark model") as err:
        WatermarkClassifier(settings).setup()
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def raft_small_file(tmp_path_factory):
    from torchvision.models.optical_flow import raft_small

    torch.manual_seed(4)
    model = raft_small(weights=None)
    path = tmp_path_factory.mktemp("raft") / "raft_small_C_T_V2-01064c6d.pth"
    torch.save(model.state_dict(), path)
    return path, model.eval()


def test_raft_motion_is_torchvisions_flow_magnitude(raft_small_file):
    import torchvision.transforms.functional as TF
    from torchvision.models.optical_flow import Raft_Small_Weights

    from vidforge.curate.scorers.motion import RaftFlow, raft_size

    path, reference = raft_small_file
    frames = _frames(2, 160, 200, seed=1)
    pairs = [(frames[0], frames[1])]
    flow = RaftFlow("raft_small", str(path))
    ours = flow.magnitudes(pairs, size=128)
    h, w = raft_size(160, 200, 128)
    assert (h, w) == (128, 160)  # shorter side 128, the other rounded to RAFT's multiple of 8
    assert raft_size(96, 160, 64) == (128, 216)  # never below the 128 RAFT's pyramid needs

    def resized(x):
        t = torch.as_tensor(np.stack(x)).permute(0, 3, 1, 2)
        return TF.resize(t, [h, w], antialias=True)

    a, b = Raft_Small_Weights.C_T_V2.transforms()(
        resized([p[0] for p in pairs]), resized([p[1] for p in pairs])
    )
    with torch.no_grad():
        expected = reference(a, b)[-1].norm(dim=1).mean(dim=(1, 2)).numpy()
    np.testing.assert_allclose(ours, expected, rtol=2e-2, atol=1e-3)


def test_raft_weights_of_the_other_size_are_one_line_user_error(raft_small_file):
    from vidforge.curate.scorers.motion import RaftFlow

    path, _ = raft_small_file
    with pytest.raises(UserInputError, match="is not raft_large's weights") as err:
        RaftFlow("raft_large", str(path)).setup()
    assert "\n" not in str(err.value)


def test_caption_runs_watermark_and_raft_and_rejects_by_the_profile(
    tmp_path, sample_videos, sample_truth, laion_watermark_file, raft_small_file
):
    from curation_fixtures import CAPTION_BARE_SETS, make_clips_dir

    from vidforge.curate import caption
    from vidforge.data.manifest import read_jsonl

    clips = make_clips_dir(tmp_path / "clips", sample_videos, sample_truth)
    sets = [
        *CAPTION_BARE_SETS,
        "curation.caption.motion.enabled=true",
        "curation.caption.motion.pairs=1",
        "curation.caption.motion.size=32",
        "curation.caption.motion.min_score=0",
        "curation.caption.motion.max_score=1000000",
        "curation.caption.motion.method=raft_small",
        f"curation.caption.motion.raft_weights={raft_small_file[0]}",
        "curation.caption.watermark.enabled=true",
        f"curation.caption.watermark.weights={laion_watermark_file[0]}",
        "curation.caption.watermark.frames=1",
        "curation.caption.watermark.max_score=0",  # any probability above 0: every clip has a "watermark"
    ]
    out = tmp_path / "out"
    caption.run(load_profile(None, sets), clips, out)
    rows = [r for r in read_jsonl(out / "manifest.jsonl") if "error:decode" not in r["reasons"]]
    assert rows and all(0 < r["watermark"] <= 1 and r["motion"] > 0 for r in rows)
    assert all("watermark" in r["reasons"] and not r["keep"] for r in rows)
    assert not any(r["random_weights"] for r in rows)  # both loaded from their files


def test_caption_refuses_missing_weights_before_loading_anything(tmp_path):
    from vidforge.curate.captioning.checks import check_inputs

    for sets, field in (
        (
            ["curation.caption.watermark.enabled=true", "curation.caption.random_weights=false"],
            "watermark.weights",
        ),
        (["curation.caption.motion.method=raft_large"], "motion.raft_weights"),
        (
            [
                "curation.caption.motion.method=raft_small",
                f"curation.caption.motion.raft_weights={tmp_path}/x",
            ],
            "no such file",
        ),
    ):
        cfg = load_profile(None, ["curation.caption.backend=sidecar", *sets]).curation.caption
        with pytest.raises(UserInputError, match=field):
            check_inputs(cfg, [])


def test_vchitect_preset_cuts_as_pyscenedetects_adaptive_detector_at_21(sample_videos):
    from scenedetect import AdaptiveDetector, detect

    from vidforge.curate.clipping.decode import analyse

    profile = load_profile("vchitect2_curation")
    cfg = profile.curation
    assert cfg.adaptive_threshold == 21.0 and cfg.caption.watermark.enabled
    assert cfg.caption.motion.method == "raft_large" and cfg.caption.ocr.enabled
    for name in ("cuts", "false_split"):
        path = str(sample_videos / f"{name}.mp4")
        theirs = [s.frame_num for s, _ in detect(path, AdaptiveDetector(adaptive_threshold=21.0))]
        ours = [shot.start for shot in analyse(path, cfg).shots]
        assert ours == theirs and len(ours) >= 2  # cuts found (fewer than at the default 3.0)
