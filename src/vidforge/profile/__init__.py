"""The run-profile: one frozen pydantic model shared by every stage. Pure data; imports no torch."""

from vidforge.profile.bench import Bench
from vidforge.profile.cluster import Accelerator, Cluster
from vidforge.profile.diffusion import Diffusion
from vidforge.profile.loading import (
    PROFILE_ENV,
    ProfileError,
    apply_override,
    apply_overrides,
    dump_profile,
    load_profile,
    resolve_profile_path,
    validate_profile,
)
from vidforge.profile.model import PRESETS, Model
from vidforge.profile.overrides import Override, as_overrides, command_line, parse_set
from vidforge.profile.parallel import Layout, Parallel
from vidforge.profile.run_profile import RunProfile

__all__ = [
    "PRESETS",
    "PROFILE_ENV",
    "Accelerator",
    "Bench",
    "Cluster",
    "Diffusion",
    "Layout",
    "Model",
    "Override",
    "Parallel",
    "ProfileError",
    "RunProfile",
    "apply_override",
    "apply_overrides",
    "as_overrides",
    "command_line",
    "dump_profile",
    "load_profile",
    "parse_set",
    "resolve_profile_path",
    "validate_profile",
]
