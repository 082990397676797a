"""Aesthetic score (LAION head on CLIP image embeddings) and caption-video CLIP similarity, each against
a direct computation: a numpy MLP from the saved weights, and CLIP's own forward pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vidforge.curate.scorers.aesthetic import AestheticHead, AestheticScorer
from vidforge.curate.scorers.clip_score import TINY_CONFIGS, ClipEmbedder, clip_similarity, preprocess_frames
from vidforge.errors import UserInputError
from vidforge.profile.caption import ClipModel


@pytest.fixture(scope="module")
def tiny_clip_dir(tmp_path_factory):
    import open_clip

    folder = tmp_path_factory.mktemp("tiny_clip")
    cfg = TINY_CONFIGS["tiny-clip"]
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": {}}))
    torch.manual_seed(1)
    model = open_clip.create_model(f"local-dir:{folder}")
    from safetensors.torch import save_file

    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(folder / "open_clip_model.safetensors"),
    )
    return folder


def _frames(seed: int, n: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 40, 56, 3), dtype=np.uint8)


def test_clip_similarity_matches_clip_forward(tiny_clip_dir):
    embedder = ClipEmbedder(ClipModel(model=f"local-dir:{tiny_clip_dir}", batch_size=3))
    embedder.setup()
    assert embedder.random_weights is False
    frames, caption = _frames(0, 5), "a red square moving right"
    score = clip_similarity(embedder.encode_images(frames), embedder.encode_texts([caption])[0])
    # Reference: CLIP's forward returns normalised features and the logit scale.
    model, loaded = embedder.loaded.model, embedder.loaded
    with torch.no_grad():
        img, txt, scale = model(preprocess_frames(frames, loaded.preprocess), loaded.tokenizer([caption]))
        logits = scale * img @ txt.T
    assert score == pytest.approx(float((logits / scale).mean()), abs=1e-5)
    assert -1.0 <= score <= 1.0


def _numpy_mlp(state: dict, x: np.ndarray) -> np.ndarray:
    for i in (0, 2, 4, 6, 7):
        x = x @ state[f"layers.{i}.weight"].numpy().T + state[f"layers.{i}.bias"].numpy()
    return x[:, 0]


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_aesthetic_head_loads_laion_layout_and_scores(tmp_path, suffix):
    torch.manual_seed(2)
    head = AestheticHead()
    state = {k: v.clone() for k, v in head.state_dict().items()}
    assert sorted(state) == sorted(f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
    path = tmp_path / f"sac+logos+ava1-l14-linearMSE{suffix}"
    if suffix == ".pth":
        torch.save(state, path)
    else:
        from safetensors.torch import save_file

        save_file(state, str(path))
    scorer = AestheticScorer(str(path))
    scorer.setup(embedding_width=768)
    emb = np.random.default_rng(3).normal(size=(4, 768)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    expected = _numpy_mlp(state, emb)
    np.testing.assert_allclose(scorer.score_frames(emb), expected, rtol=1e-4, atol=1e-5)
    assert scorer.score_clip(emb) == pytest.approx(float(expected.mean()), rel=1e-4, abs=1e-5)
    assert scorer.random_weights is False


def test_aesthetic_refuses_without_weights_and_checks_width(tmp_path):
    with pytest.raises(UserInputError, match="aesthetic.head"):
        AestheticScorer(None).setup()
    scorer = AestheticScorer(None, random_weights=True)
    scorer.setup()
    assert scorer.random_weights is True
    with pytest.raises(UserInputError, match="768-wide"):
        scorer.setup(embedding_width=512)
    bogus = tmp_path / "bogus.pth"
    torch.save({"weight": torch.zeros(1)}, bogus)
    with pytest.raises(UserInputError, match="not a LAION aesthetic head"):
        AestheticScorer(str(bogus)).setup()


def test_clip_model_without_weights_refuses():
    with pytest.raises(UserInputError, match="curation.caption.clip.checkpoint"):
        ClipEmbedder(ClipModel(model="ViT-B-32")).setup()
