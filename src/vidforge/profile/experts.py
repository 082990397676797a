"""The checks of a two-expert model (Wan2.2 A14B: `model.experts`, `model.boundary_ratio`) that span
sections: the low-noise expert's guidance (`diffusion.guidance_2`) and the expert a run trains
(`train.expert`) have a meaning only with two experts, and a run of one expert cannot validate by
sampling, nor be distilled into a few-step student (which samples the whole range of t)."""

from __future__ import annotations

from vidforge.profile.run_profile import RunProfile


def expert_problems(profile: RunProfile) -> list[str]:
    """`field: what is wrong; what to change` of the profile's expert settings."""
    if profile.model.experts == 2:
        expert = profile.train.expert
        if expert is not None and profile.train.distill is not None:
            return [
                f"train.distill: a few-step student samples from pure noise (t=1) to clean (t=0), the "
                f"{expert}-noise expert alone runs on its side of model.boundary_ratio="
                f"{profile.model.boundary_ratio:g} only (its student would "
                "step outside what it was trained on); distil a one-expert model, or drop train.distill"
            ]
        if expert is not None and profile.train.validate_every:
            return [
                f"train.validate_every: the {expert}-noise expert alone cannot sample the "
                "two-expert model (its samples would run it over the other's times too); set "
                "train.validate_every=0 and sample the run with infer -c DOWNLOAD --lora RUN"
            ]
        if expert is not None and profile.diffusion.objective != "flow":
            return [
                f"diffusion.objective: the {expert}-noise expert trains on its side of model.boundary_ratio, a "
                "flow time (two experts switch by it); set diffusion.objective=flow"
            ]
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
