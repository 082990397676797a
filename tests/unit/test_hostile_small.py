"""The smaller points of issue 38 (point 10) that are settings or records: each was a raw error or a
silent change, and is one line naming what to fix."""

from __future__ import annotations

import json

import pytest

from vidforge.curate.caption import read_clip_manifest
from vidforge.errors import UserInputError
from vidforge.profile import load_profile


@pytest.mark.parametrize("setting", ["train.steps=true", "train.lr=false", "infer.frames=true"])
def test_a_yes_no_given_for_a_number_is_refused(setting) -> None:
    """`train.steps=true` trained one step: pydantic reads true as 1."""
    name = setting.split("=")[0].split(".")[-1]
    value = setting.split("=")[1]
    with pytest.raises(
        UserInputError, match=f"^--set {setting}: {value} is a yes/no, and {name} takes a number$"
    ):
        load_profile("local_cpu", [setting])
    load_profile("local_cpu", ["data.packing=true"])  # a yes/no where one is asked for still is one


def test_an_infer_seed_beyond_64_bits_is_refused_at_load() -> None:
    """`infer --seed 99999999999999999999999` overflowed inside torch's generator."""
    with pytest.raises(
        UserInputError, match=r"^--set infer.seed=99999999999999999999999: .*less than or equal"
    ):
        load_profile("local_cpu", ["infer.seed=99999999999999999999999"])
    assert load_profile("local_cpu", ["infer.seed=4611686018427387904"]).infer.seed == 2**62


def test_a_clip_manifest_line_that_is_not_a_record_is_one_line(tmp_path) -> None:
    """`caption` on a manifest whose line is a JSON list ended with a raw AttributeError."""
    (tmp_path / "manifest.jsonl").write_text(
        json.dumps({"clip_id": "a"}) + "\n" + json.dumps(["a", 1]) + "\n"
    )
    with pytest.raises(UserInputError) as err:
        read_clip_manifest(tmp_path)
    assert str(err.value).startswith(
        f"{tmp_path / 'manifest.jsonl'}: record 2 is a JSON list, not an object; "
    )
