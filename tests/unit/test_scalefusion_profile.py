"""ScaleFusion's profile fields (issue 26): L_T / L_S are lookahead depths now, under new names; the old
names, whose meaning (parts of the first slice's all-to-all) is gone, are refused in one line."""

from __future__ import annotations

import pytest

from vidforge.parallel.scalefusion import ScaleFusionSlicing
from vidforge.profile import ProfileError, load_profile


@pytest.mark.parametrize("axis", ["t", "s"])
def test_old_first_parts_fields_are_refused_naming_the_new_one(axis: str) -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("local_cpu", [f"infer.scalefusion_first_parts_{axis}=2"])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"--set infer.scalefusion_first_parts_{axis}=2: renamed infer.scalefusion_lookahead_{axis}"
    )


def test_profile_defaults_are_the_slicing_defaults() -> None:
    infer = load_profile("local_cpu").infer
    fields = (infer.scalefusion_slices_t, infer.scalefusion_slices_s)
    fields += (infer.scalefusion_lookahead_t, infer.scalefusion_lookahead_s)
    assert ScaleFusionSlicing(*fields) == ScaleFusionSlicing() == ScaleFusionSlicing(4, 4, 1, 1)


def test_slicing_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match=r"^infer.scalefusion_lookahead_s: must be an integer >= 1, got 0$"):
        ScaleFusionSlicing(4, 4, 1, 0)
