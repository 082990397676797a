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


class _Planted:
    """Unpickling this runs `touch <marker>`: a weights file that carries code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_weights_file_carrying_code_is_one_line_naming_the_field_and_runs_nothing(tmp_path) -> None:
    """A refused weight file showed torch's page of advice, ending with "retry with weights_only=False"
    (which would run the code), and named no profile field."""
    import torch

    from vidforge.curate.scorers.aesthetic import load_head

    marker = tmp_path / "ran"
    path = tmp_path / "head.pth"
    torch.save({"layers.0.weight": _Planted(marker)}, path)
    with pytest.raises(UserInputError) as err:
        load_head(str(path))
    message = str(err.value)
    assert message.startswith(f"curation.caption.aesthetic.head: {path} holds more than weights (")
    assert "weights_only=False" not in message and "\n" not in message
    assert not marker.exists()
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(
        UserInputError, match="^curation.caption.aesthetic.head: .*junk.pth is not a torch weights file"
    ):
        load_head(str(tmp_path / "junk.pth"))
