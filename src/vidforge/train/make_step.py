"""Which `TrainStep` a profile trains with: the pipeline's when the model is split into stages, DMD2's
under `train.distill`, else the plain one. Above both step modules, so neither imports the other."""

from __future__ import annotations

from vidforge.parallel.runtime import Runtime
from vidforge.profile import RunProfile
from vidforge.train.build import TrainParts
from vidforge.train.distill import DistillTrainStep
from vidforge.train.step import LocalTrainStep, PipelineTrainStep, TrainStep


def make_train_step(profile: RunProfile, runtime: Runtime, parts: TrainParts) -> TrainStep:
    if profile.train.distill is not None:
        return DistillTrainStep(profile, runtime, parts)
    return (PipelineTrainStep if parts.pipeline is not None else LocalTrainStep)(profile, runtime, parts)
