"""A message that names a profile field (`parallel.cp_impl: ...`, `model.attention=...`) tells the user
what to change, so its exception is a `UserInputError` (the CLI exits 2 with that line), never a plain
`ValueError` (exit 1 with a traceback). Scanned over the library's source, so new ones stay out.
Pydantic validators in `profile/` raise ValueError by pydantic's contract (the loader turns the
ValidationError into a UserInputError) and are left out."""

from __future__ import annotations

import re
from pathlib import Path

import vidforge
from vidforge.profile import RunProfile

SRC = Path(vidforge.__file__).parent
SECTIONS = "|".join(RunProfile.model_fields)
# `raise ValueError(` then a string literal (maybe f-, maybe on the next line) naming `<section>.<field>`
# followed by `:` or `=` (the field-style message), before the literal ends.
FIELD_STYLE = re.compile(rf'raise ValueError\(\s*f?"[^"\n]*\b(?:{SECTIONS})\.\w+(?:\[[^\]"]*\])?\s*[:=]')


def test_the_scan_finds_a_field_style_value_error():
    assert FIELD_STYLE.search('raise ValueError(f"parallel.cp_ulysses: {u} must divide parallel.cp")')
    assert FIELD_STYLE.search('raise ValueError(\n    "diffusion.churn: the RES sampler is deterministic"')
    assert not FIELD_STYLE.search('raise ValueError(f"expected video (B, 3, F, H, W), got {shape}")')
    assert not FIELD_STYLE.search('raise UserInputError(f"model.text_dim: 16 != 32")')


def test_no_library_code_raises_a_field_style_value_error():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.parent.name == "profile":
            continue
        text = path.read_text(encoding="utf-8")
        for match in FIELD_STYLE.finditer(text):
            found.append(f"{path.relative_to(SRC)}:{text.count(chr(10), 0, match.start()) + 1}")
    assert not found, f"raise UserInputError for these (the message names a profile field): {found}"


def test_a_text_width_mismatch_between_data_and_model_is_one_line_at_load(tmp_path):
    import json

    import pytest

    from vidforge.data.loader import ShardLoader
    from vidforge.data.testing import make_latent_shards
    from vidforge.errors import UserInputError
    from vidforge.profile import load_profile

    shards = make_latent_shards(tmp_path / "latents", shards=1, per_shard=2, text_shape=(8, 16))
    index = json.loads((shards / "index.json").read_text())
    (shards / "index.json").write_text(json.dumps({**index, "text_encoder": {"width": 16}}))
    with pytest.raises(
        UserInputError, match=r"^model\.text_dim: .* 16-wide .* takes 32; set --set model\.text_dim=16"
    ):
        ShardLoader.from_profile(load_profile(None, ["model.text_dim=32"]), [shards])
    sample = next(iter(ShardLoader.from_profile(load_profile(None, ["model.text_dim=16"]), [shards])))
    assert sample["text_emb.npy"].shape[-1] == 16
