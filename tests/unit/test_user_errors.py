"""A message that names a profile field (`parallel.cp_impl: ...`, `check model.text_dim`) tells the user
what to change, so its exception is a `UserInputError` (the CLI exits 2 with that line), never a plain
`ValueError` (exit 1 with a traceback). Scanned over the library's source (every `raise ValueError(...)`,
the text of its message outside f-string placeholders), so new ones stay out. Pydantic validators in
`profile/` and the families' model sections (`families/**/model.py`) raise ValueError by pydantic's
contract (the loader turns the ValidationError into a UserInputError) and are left out; math that the profile feeds (diffusion/'s schedules) guards its callers
without naming the profile."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import vidforge
from vidforge.profile import RunProfile

SRC = Path(vidforge.__file__).parent
# `<section>.<field>` anywhere in the message's literal text (`infer.scalefusion_{name}`, `bench.latent_*`)
FIELD = re.compile(rf"(?<![\w.])(?:{'|'.join(RunProfile.model_fields)})\.[\w*]")


def _message_text(node: ast.AST) -> str:
    """The literal text of a message expression: string constants, f-strings without their placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_message_text(v) for v in node.values if isinstance(v, ast.Constant))
    if isinstance(node, ast.BinOp):
        return _message_text(node.left) + " " + _message_text(node.right)
    return ""


def field_style_value_errors(source: str) -> list[int]:
    """Lines of `raise ValueError(...)` whose message names a profile field."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and isinstance(node.exc.func, ast.Name)
        and node.exc.func.id == "ValueError"
        and any(FIELD.search(_message_text(arg)) for arg in node.exc.args)
    ]


def test_the_scan_finds_a_field_style_value_error():
    assert field_style_value_errors('raise ValueError(f"parallel.cp_ulysses: {u} must divide parallel.cp")')
    assert field_style_value_errors(
        'raise ValueError(\n    "diffusion.churn: the RES sampler is deterministic"\n)'
    )
    assert field_style_value_errors('raise ValueError(f"text {shape}; " "check model.text_dim against it")')
    assert field_style_value_errors('raise ValueError(f"infer.scalefusion_{name}: must be >= 1")')
    assert not field_style_value_errors('raise ValueError(f"expected video (B, 3, F, H, W), got {shape}")')
    assert not field_style_value_errors('raise ValueError(f"{path}: format {data.get(key)!r}")')
    assert not field_style_value_errors('raise UserInputError(f"model.text_dim: 16 != 32")')
    assert not field_style_value_errors(
        'raise ValueError("call vidforge.parallel.context_parallel.apply_cp")'
    )


def _model_section(path: Path) -> bool:
    """The profile's `model` section, which each family defines in its package (`families/model.py`,
    `families/<name>/model.py`): validators, as profile/'s."""
    return path.name == "model.py" and "families" in path.relative_to(SRC).parts


def test_no_library_code_raises_a_field_style_value_error():
    found = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if path.parent.name != "profile" and not _model_section(path)
        for line in field_style_value_errors(path.read_text(encoding="utf-8"))
    ]
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


def test_a_text_width_the_index_does_not_record_is_one_line_before_the_network_runs():
    """Shards whose index.json names no text width (written by another tool) pass the load check; the
    loss's draw, which every rank (every pipeline stage) runs before the schedule, refuses the first
    batch in one line, as it does for model.in_channels."""
    import pytest
    import torch

    from vidforge.data.batching import BucketBatch
    from vidforge.diffusion.edm import EDM
    from vidforge.errors import UserInputError
    from vidforge.train.loss import DenoisingLoss

    batch = BucketBatch(
        torch.randn(1, 4, 1, 2, 2), torch.randn(1, 3, 16), torch.ones(1, 3, dtype=torch.bool), ["a"], [{}]
    )
    wrong = DenoisingLoss(EDM(), 0.0, (1, 2, 2), in_channels=4, text_dim=32)
    with pytest.raises(
        UserInputError, match=r"^model\.text_dim: .* 16 wide .* takes 32; set --set model\.text_dim=16$"
    ):
        wrong.draw(batch, torch.device("cpu"))
    right = DenoisingLoss(EDM(), 0.0, (1, 2, 2), in_channels=4, text_dim=16)
    assert right.draw(batch, torch.device("cpu")).model_kwargs["text"].shape == (1, 3, 16)
