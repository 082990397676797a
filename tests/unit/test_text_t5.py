"""`T5TextEncoder` against transformers' own `T5EncoderModel` on a tiny random T5 and a local word-level
tokenizer (no downloads). The reference token ids are built here from the vocabulary, not by the tokenizer
under test, so the check covers the tokenizer call (padding, truncation, eos) as well as the model call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from vidforge.errors import UserInputError  # noqa: E402
from vidforge.text.encoders import T5TextEncoder  # noqa: E402

WORDS = ["a", "cat", "dog", "runs", "on", "the", "red", "grass", "under", "blue", "sky", "slowly"]
SPECIAL = ["<pad>", "</s>", "<unk>"]
VOCAB = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
PAD, EOS, UNK = 0, 1, 2
MAX_LEN = 8


def _save_tokenizer(folder) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)


SHAPE = {
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "pad_token_id": PAD,
    "eos_token_id": EOS,
    "decoder_start_token_id": PAD,
}


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    from transformers import T5Config, T5EncoderModel

    folder = tmp_path_factory.mktemp("t5")
    _save_tokenizer(folder)
    config = T5Config(vocab_size=len(VOCAB), **SHAPE)
    torch.manual_seed(0)
    model = T5EncoderModel(config).eval()
    model.save_pretrained(folder)
    return folder, model


def _ids(caption: str) -> tuple[torch.Tensor, torch.Tensor]:
    """What a T5 tokenizer should give: word ids, then eos, truncated to MAX_LEN (eos kept), padded."""
    ids = [VOCAB.get(w, UNK) for w in caption.split()][: MAX_LEN - 1] + [EOS]
    mask = [1] * len(ids) + [0] * (MAX_LEN - len(ids))
    return torch.tensor([ids + [PAD] * (MAX_LEN - len(ids))]), torch.tensor([mask])


def _reference(model, caption: str) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = _ids(caption)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state[0]
    return hidden.numpy(), mask[0].bool().numpy()


CAPTIONS = ["a cat runs", "the red dog runs on the blue grass", "", "a zebra under the sky"]


def test_hidden_states_and_mask_match_transformers(t5_dir):
    folder, model = t5_dir
    enc = T5TextEncoder(str(folder), max_length=MAX_LEN, device="cpu", batch_size=3)  # two batches
    assert enc.width == 32 and enc.max_length == MAX_LEN
    hidden, mask = enc.encode(CAPTIONS)
    assert hidden.dtype == np.float16 and hidden.shape == (len(CAPTIONS), MAX_LEN, 32)
    assert mask.dtype == bool and mask.shape == (len(CAPTIONS), MAX_LEN)
    for i, caption in enumerate(CAPTIONS):
        ref, ref_mask = _reference(model, caption)
        np.testing.assert_array_equal(mask[i], ref_mask, err_msg=caption)
        n = int(ref_mask.sum())
        assert n == min(len(caption.split()) + 1, MAX_LEN)
        np.testing.assert_allclose(
            hidden[i, :n].astype(np.float32), ref[:n], rtol=2e-3, atol=2e-3, err_msg=caption
        )
        assert np.abs(ref[:n]).max() > 0.1  # the comparison is not between zeros
        # padding positions are masked and zeroed
        assert not mask[i, n:].any()
        assert (hidden[i, n:] == 0).all()


def test_padding_does_not_change_real_tokens(t5_dir):
    folder, _ = t5_dir
    enc = T5TextEncoder(str(folder), max_length=MAX_LEN, device="cpu")
    alone, _ = enc.encode(["a cat runs"])
    batched, _ = enc.encode(["a cat runs", "the red dog runs on the blue grass"])
    np.testing.assert_array_equal(alone[0], batched[0])


def test_long_captions_are_truncated(t5_dir):
    folder, model = t5_dir
    enc = T5TextEncoder(str(folder), max_length=MAX_LEN, device="cpu")
    long = " ".join(WORDS * 3)  # 36 words
    hidden, mask = enc.encode([long])
    assert hidden.shape == (1, MAX_LEN, 32) and mask.all()
    tokens = enc.tokenizer([long], padding="max_length", truncation=True, max_length=MAX_LEN)["input_ids"][0]
    assert tokens == [VOCAB[w] for w in WORDS[: MAX_LEN - 1]] + [EOS]  # truncated, eos kept last
    ref, _ = _reference(model, long)
    np.testing.assert_allclose(hidden[0].astype(np.float32), ref, rtol=2e-3, atol=2e-3)
    assert enc.encode([])[0].shape == (0, MAX_LEN, 32)


def test_umt5_folder_equals_transformers_umt5_encoder(tmp_path):
    """Wan's text encoder: a tiny random umT5 saved with save_pretrained. Loading it as T5 would lose
    the relative position bias of every layer but the first; the check that it was not is that the
    output equals UMT5EncoderModel's and differs from T5EncoderModel's on the same folder."""
    from transformers import T5EncoderModel, UMT5Config, UMT5EncoderModel

    _save_tokenizer(tmp_path)
    torch.manual_seed(0)
    UMT5EncoderModel(UMT5Config(vocab_size=len(VOCAB), **SHAPE)).eval().save_pretrained(tmp_path)
    reference = UMT5EncoderModel.from_pretrained(tmp_path).eval()
    enc = T5TextEncoder(str(tmp_path), max_length=MAX_LEN, device="cpu")
    hidden, mask = enc.encode(CAPTIONS[:2])
    as_t5 = _reference(T5EncoderModel.from_pretrained(tmp_path).eval(), CAPTIONS[1])[0]
    for i, caption in enumerate(CAPTIONS[:2]):
        ref, ref_mask = _reference(reference, caption)
        n = int(ref_mask.sum())
        np.testing.assert_array_equal(mask[i], ref_mask)
        np.testing.assert_allclose(hidden[i, :n].astype(np.float32), ref[:n], rtol=2e-3, atol=2e-3)
    assert np.abs(hidden[1, :n].astype(np.float32) - as_t5[:n]).max() > 0.05
    assert enc.describe()["model_type"] == "umt5"


def test_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserInputError, match="config.json"):
        T5TextEncoder(str(tmp_path), device="cpu")


def test_loading_under_the_cli_prints_no_progress_bar(t5_dir, capfd, monkeypatch):
    """transformers' "Loading weights" bar landed inside tokenize's, train's and infer's output: every
    command turns the libraries' own bars off (`cli._output.silence_library_bars`, the one owner)."""
    from transformers.utils import logging as hf_logging
    from typer.testing import CliRunner

    from vidforge.cli.app import app

    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # restored after the test, as the switch below
    hf_logging.enable_progress_bar()
    try:
        assert CliRunner().invoke(app, ["profile", "show"]).exit_code == 0
        capfd.readouterr()
        T5TextEncoder(t5_dir[0], max_length=8)
        captured = capfd.readouterr()
        assert "Loading weights" not in captured.err + captured.out
    finally:
        hf_logging.enable_progress_bar()
