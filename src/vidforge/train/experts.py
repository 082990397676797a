"""Training one expert of a two-expert model (Wan2.2 A14B: `model.experts=2`): a run trains the expert
`train.expert` names, started from that expert's weights (`--init` of the download reads its
transformer/ or transformer_2/: `Published.expert_folders`), on the flow times it runs
at in sampling only (high: t >= model.boundary_ratio; low: below it), drawn from the profile's time
distribution restricted to that range (`RectifiedFlow.t_range`)."""

from __future__ import annotations

import dataclasses

from vidforge.diffusion.objective import Objective
from vidforge.errors import UserInputError
from vidforge.profile import RunProfile
from vidforge.weights.experts import expert_range


def require_expert(profile: RunProfile) -> None:
    """A two-expert model trains one expert a run: refuse a profile that names none."""
    if profile.model.experts == 2 and profile.train.expert is None:
        raise UserInputError(
            "train.expert: a two-expert model (model.experts=2) trains one expert a run, each on its own "
            "range of t; set train.expert=high (t >= model.boundary_ratio) or train.expert=low"
        )


def expert_objective(objective: Objective, profile: RunProfile) -> Objective:
    """The run's objective with its training times restricted to `train.expert`'s range (as it is
    without one). The profile's checks (`vidforge.profile.experts`) have refused an objective other than
    flow, whose times the experts switch by."""
    expert = profile.train.expert
    if expert is None or profile.model.experts != 2:
        return objective
    return dataclasses.replace(objective, t_range=expert_range(profile.model.boundary_ratio, expert))
