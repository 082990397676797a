"""CoCa captions with a tiny random CoCa saved in open-clip's local-dir layout and loaded by open-clip's
own loader. The greedy decoder is checked against open-clip's `generate` (top-k with k=1 is greedy),
run with transformers' logits processors patched in because open-clip's import of BeamSearchScorer
fails on transformers 5."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vidforge.curate.captioning.captioners import ClipItem
from vidforge.curate.captioning.captioners.coca import (
    CocaCaptioner,
    decode_tokens,
    greedy_generate,
    merge_captions,
)
from vidforge.curate.scorers.clip_score import TINY_CONFIGS, preprocess_frames
from vidforge.errors import UserInputError
from vidforge.profile.caption import CocaCaptioner as CocaSettings


@pytest.fixture(scope="module")
def tiny_coca_dir(tmp_path_factory):
    import open_clip

    folder = tmp_path_factory.mktemp("tiny_coca")
    cfg = json.loads(json.dumps(TINY_CONFIGS["tiny-coca"]))
    cfg["vision_cfg"]["image_size"] = 32
    cfg["vision_cfg"]["patch_size"] = 8
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": {}}))
    torch.manual_seed(0)
    model = open_clip.create_model(f"local-dir:{folder}")
    # Random init puts almost all mass on one token; spread the decoder's output so captions vary by image.
    with torch.no_grad():
        model.text_decoder.text_projection.normal_(0, 2.0)
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    return folder


def _frames(seed: int, n: int = 6) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for i in range(n)}


def _enable_open_clip_generate(monkeypatch):
    import open_clip.coca_model as cm
    import transformers

    for name in (
        "LogitsProcessorList",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "MinLengthLogitsProcessor",
        "MaxLengthCriteria",
        "StoppingCriteriaList",
    ):
        monkeypatch.setattr(cm, name, getattr(transformers, name), raising=False)
    monkeypatch.setattr(cm, "GENERATION_TYPES", {"top_k": transformers.TopKLogitsWarper}, raising=False)
    monkeypatch.setattr(cm, "_has_transformers", True)


def test_greedy_decoder_matches_open_clip_generate(tiny_coca_dir, monkeypatch):
    _enable_open_clip_generate(monkeypatch)
    captioner = CocaCaptioner(
        CocaSettings(model=f"local-dir:{tiny_coca_dir}", max_tokens=12, repetition_penalty=1.3)
    )
    captioner.setup()
    assert captioner.random_weights is False  # the weights file was loaded
    model = captioner.loaded.model
    images = preprocess_frames(np.stack([_frames(s)[0] for s in range(4)]), captioner.loaded.preprocess)
    ours = greedy_generate(model, images, max_tokens=12, min_tokens=5, repetition_penalty=1.3)
    for i in range(len(images)):
        torch.manual_seed(0)
        ref = model.generate(
            images[i : i + 1],
            generation_type="top_k",
            top_k=1,
            seq_len=12,
            min_seq_len=5,
            repetition_penalty=1.3,
        )
        assert decode_tokens(ours[i]) == decode_tokens(ref[0])
        assert ours[i, : ref.shape[1]].tolist() == ref[0].tolist()
    texts = [decode_tokens(row) for row in ours]
    assert len(set(texts)) > 1  # captions depend on the image


def test_coca_captioner_batches_merges_and_isolates_failures(tiny_coca_dir):
    settings = CocaSettings(model=f"local-dir:{tiny_coca_dir}", frames=3, batch_size=4, max_tokens=10)
    captioner = CocaCaptioner(settings)
    items = [ClipItem(f"c{i}", {}, 6, _frames(10 + i)) for i in range(3)]
    batched = captioner.caption(items)
    # Reference: each keyframe captioned alone, then merged.
    for item, result in zip(items, batched, strict=True):
        alone = [
            captioner.caption_images(item.frames[i][None])[0] for i in (0, 2, 5)
        ]  # first/middle/last of 6
        assert result.text == merge_captions(alone)
        assert result.error is None and result.source == f"coca:local-dir:{tiny_coca_dir}"
    # A clip whose frames the model cannot take fails alone; the others are still captioned.
    broken = ClipItem("bad", {}, 6, {i: np.zeros((48, 64, 3), np.float64) for i in range(6)})
    results = captioner.caption([items[0], broken, items[1]])
    assert [r.text for r in results] == [batched[0].text, None, batched[1].text]
    assert results[1].error


def test_merge_captions():
    assert merge_captions(["a dog runs", "A dog runs.", "a cat sits"]) == "A dog runs. A cat sits."
    assert merge_captions(["x", "y", "z"], "middle") == "y"
    assert merge_captions([]) == ""


def test_coca_without_weights_refuses(tmp_path):
    with pytest.raises(UserInputError, match="random_weights"):
        CocaCaptioner(CocaSettings(model="coca_ViT-B-32")).setup()
    with pytest.raises(UserInputError, match="no such file"):
        CocaCaptioner(CocaSettings(model="coca_ViT-B-32", checkpoint=str(tmp_path / "nope.bin"))).setup()
