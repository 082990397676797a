"""The layout rulebook on parallel.cp_impl=st-spatial: what it needs (an ST-DiT, tp x cp dividing the
heads, at least cp positions a frame) is refused on one line naming the field; the joint image-video
buckets that st-hybrid refuses (latent T = 1, 5, 9 under cp=2) load."""

from pathlib import Path

import pytest
import yaml

from vidforge.profile import ProfileError, load_profile

# 4x temporal and 8x spatial compression, patch (1, 2, 2) (the defaults): frames 1, 17, 33 -> T = 1, 5, 9;
# (48, 48) -> 3 x 3 = 9 positions a frame (odd), (16, 16) -> 1 x 1
JOINT = {"frame_buckets": [1, 17, 33], "buckets": [[48, 64], [48, 48]]}


def _load(tmp_path: Path, impl: str, **sections) -> None:
    data = {
        "cluster": {"cpu_processes": 2},
        "parallel": {"cp": 2, "cp_impl": impl},
        "model": {"architecture": "stdit", "heads": 4},
        "data": JOINT,
    }
    for name, fields in sections.items():
        data[name] = {**data.get(name, {}), **fields}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    load_profile(str(path))


def test_joint_image_video_buckets_load_under_st_spatial_not_st_hybrid(tmp_path: Path) -> None:
    _load(tmp_path, "st-spatial")
    with pytest.raises(ProfileError) as refused:
        _load(tmp_path, "st-hybrid")
    for frames, t in ((1, 1), (17, 5), (33, 9)):
        assert f"data.frame_buckets: {frames} frames give {t} latent token frames" in str(refused.value)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"model": {"architecture": "dit"}}, "parallel.cp_impl: st-spatial is for model.architecture=stdit"),
        (
            {"model": {"heads": 1}},
            "parallel.cp: st-spatial splits spatial attention's heads over tp x cp = 2",
        ),
        ({"data": {"buckets": [[16, 16]]}}, "data.buckets: (16, 16) gives 1 token positions a frame, fewer"),
    ],
)
def test_st_spatial_refuses_what_it_cannot_split(tmp_path: Path, sections: dict, message: str) -> None:
    with pytest.raises(ProfileError, match="st-spatial|fewer") as refused:
        _load(tmp_path, "st-spatial", **sections)
    assert message in str(refused.value)
