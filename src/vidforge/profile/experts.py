"""The checks of a two-expert model (Wan2.2 A14B: `model.experts`, `model.boundary_ratio`) that span
sections: the low-noise expert's guidance (`diffusion.guidance_2`) and the expert a run trains
(`train.expert`) have a meaning only with two experts."""

from __future__ import annotations

from vidforge.profile.run_profile import RunProfile


def expert_problems(profile: RunProfile) -> list[str]:
    """`field: what is wrong; what to change` for the expert settings of a one-expert model."""
    if profile.model.experts == 2:
        return []
    problems = []
    if profile.diffusion.guidance_2 is not None:
        problems.append(
            "diffusion.guidance_2: only a two-expert model (model.experts=2) has a second guidance scale; "
            "drop it or use diffusion.guidance"
        )
    if profile.train.expert is not None:
        problems.append(
            f"train.expert: {profile.train.expert} names an expert of a two-expert model (model.experts=2); "
            "this model has one, drop train.expert"
        )
    return problems
