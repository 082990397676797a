"""Hostile inputs, round three (issue 46, items 7, 12 and 14's sidecar): an input is read as what it is
(a 16-bit image at its bit depth, a caption of any length) or refused in one line naming the file and
the value (a segment ending at nan matched no clip, silently)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vidforge.curate.captioning.captioners.sidecar import read_csv_captions, read_json_sidecar
from vidforge.data.media import read_image
from vidforge.errors import UserInputError
from vidforge.tokenizers.image_condition import load_image


@pytest.mark.parametrize("level", [0, 1000, 32768, 65535])
def test_a_16_bit_png_is_read_at_its_bit_depth(tmp_path, level):
    path = tmp_path / "grey16.png"
    Image.fromarray(np.full((6, 8), level, np.uint16)).save(path)
    with Image.open(path) as raw:
        assert raw.mode.startswith("I")  # Pillow keeps the 16 bits: what load_image must scale
    # infer --image's reader, and the training data's (a still image in a shard), one rule
    for pixels in (np.asarray(load_image(path)), read_image(path.read_bytes())[0]):
        assert pixels.shape == (6, 8, 3)
        assert np.all(np.abs(pixels.astype(float) - level / 65535 * 255) <= 0.5)  # 50% grey: 128, not 255


def test_an_8_bit_image_is_read_unchanged(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    assert np.array_equal(np.asarray(load_image(tmp_path / "a.png")), rgb)


def test_a_caption_longer_than_the_csv_modules_field_limit_is_read(tmp_path):
    caption = "a long caption " * 11_000  # 165 KB, past csv's default limit of 131072
    (tmp_path / "captions.csv").write_text(f'path,caption\nv.mp4,"{caption}"\n')
    segments = read_csv_captions(tmp_path / "captions.csv")
    assert segments["v.mp4"][0].text == caption


@pytest.mark.parametrize("value", ["nan", "inf", "-1e999", "soon"])
def test_a_sidecar_segment_time_that_is_no_finite_number_is_one_line_naming_it(tmp_path, value):
    (tmp_path / "captions.csv").write_text(
        f"path,caption,start,end\nv.mp4,a ball,0,2\nw.mp4,a cat,0,{value}\n"
    )
    with pytest.raises(
        UserInputError, match=rf"captions\.csv: line 3: end='{value}' is not a number of seconds"
    ):
        read_csv_captions(tmp_path / "captions.csv")
    (tmp_path / "v.mp4.captions.json").write_text(f'[{{"start": 0, "end": "{value}", "text": "a"}}]')
    with pytest.raises(UserInputError, match=r"captions\.json: segment 0: end="):
        read_json_sidecar(tmp_path / "v.mp4.captions.json")


def test_a_sidecar_segment_ending_before_it_starts_is_refused(tmp_path):
    (tmp_path / "captions.csv").write_text("path,caption,start,end\nv.mp4,a ball,3,2\n")
    with pytest.raises(UserInputError, match="line 2: end=2 is not after start=3"):
        read_csv_captions(tmp_path / "captions.csv")


def test_a_sidecar_csv_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    (tmp_path / "captions.csv").write_bytes("path,caption\nv.mp4,sûr\n".encode("latin-1"))
    with pytest.raises(UserInputError, match=r"captions\.csv: the caption CSV is not UTF-8"):
        read_csv_captions(tmp_path / "captions.csv")


@pytest.mark.parametrize("expert", ["low", "high"])
def test_distilling_one_expert_of_two_is_refused_at_load(expert):
    """A few-step student samples from pure noise (t=1) to clean (t=0): one expert of Wan2.2 A14B runs
    only on its side of the boundary (low: t < 0.875), so its student's levels left the range it was
    trained on (they started at t=1.0), silently."""
    from vidforge.profile.loading import ProfileError, validate_profile

    data = {
        "model": {"preset": "wan2.2-t2v-a14b"},
        "diffusion": {"objective": "flow"},  # an expert trains by the flow time (refused at load otherwise)
        "train": {"expert": expert, "validate_every": 0, "distill": {"steps": 4, "teacher": "wan22"}},
    }
    with pytest.raises(ProfileError, match=rf"^profile: train.distill: .*the {expert}-noise expert") as err:
        validate_profile(data)
    assert "\n" not in str(err.value)
    data["train"].pop("distill")
    validate_profile(data)  # training that expert is as it was
