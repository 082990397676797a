"""The half of the GPU suite that runs here: gather, for the device's Python, the wheels of every
runtime dependency of vidforge that the device image lacks, plus vidforge's own wheel, into an ignored
folder that travels with the working tree (`carry`); and check that folder for completeness.

    python bench/gpu/gather.py                 # resolve, download into .gpu-wheels/, verify
    python bench/gpu/gather.py --check         # resolve from package metadata only (no wheel downloads)
    python bench/gpu/gather.py --verify        # check an already gathered folder, offline
    python bench/gpu/gather.py --installed     # on the device: check what is importable there

Complete means: every requirement reachable from pyproject.toml's `dependencies` and `gpu` extra, with
markers read for the target (CPython 3.12 on x86-64 Linux), is met by the image (image_packages.txt),
by a wheel in the folder whose version meets every specifier that reached it, or is in LEFT_OUT with
its reason. The walk
stops at image packages: the image installed their own needs. Versions come from pip's resolver one
level at a time (`pip install --dry-run --no-deps --report`, which reads the index's metadata files
instead of downloading wheels), then each chosen wheel is downloaded once with `pip download --no-deps`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEST = ROOT / ".gpu-wheels"
CARRY_LIMIT = 64 * 2**20  # what travels with one device call, the working tree included

PYTHON = "3.12"
# The device image is Ubuntu 24.04's Python 3.12.3 (glibc 2.39): every manylinux tag up to 2_39.
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 40)
]
TARGET_MARKERS = {
    **default_environment(),
    "python_version": PYTHON,
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "implementation_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}

# Runtime dependencies deliberately not carried, with the reason the table and the check print.
LEFT_OUT = {
    "ray": "only `--executor ray` of clip/caption imports it; its wheel (~70 MB) alone is over the "
    "64 MiB that travels with a device call",
    "flash-attn": "PyPI has no wheel of it (it builds against the local torch); the flash backend rows "
    "skip with that reason",
}
# Requirements met by another distribution of the same module: scenedetect asks for opencv-python, and
# the image's opencv-python-headless installs the same `cv2` (without the GUI, which nothing here uses).
SAME_MODULE = {"opencv-python": "opencv-python-headless"}
# Image packages carried anyway: the image's version was never read, and vidforge needs a recent one.
CARRY_ANYWAY = {"typer": "the CLI needs typer >= 0.29 (its own click); the image's version is unrecorded"}


@dataclass
class Dist:
    """One chosen distribution: version, the requirements its metadata declares, where it comes from."""

    name: str
    version: str
    requires: list[str]
    source: str  # "index" url or wheel path


@dataclass
class Plan:
    """The outcome of the walk: what the image gives, what is carried, what is left out, what is wrong."""

    image: dict[str, str | None] = field(default_factory=dict)
    carried: dict[str, Dist] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "python": PYTHON,
            "image": self.image,
            "carried": {n: d.version for n, d in sorted(self.carried.items())},
            "left_out": self.left_out,
            "problems": self.problems,
            "complete": not self.problems,
        }


def project_requirements(
    gpu_extra: bool = True, pyproject: Path = ROOT / "pyproject.toml"
) -> list[Requirement]:
    """`dependencies`, and the `gpu` extra (torchao for FP8; flash-attn, which LEFT_OUT names)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extra = project["optional-dependencies"]["gpu"] if gpu_extra else []
    return [Requirement(r) for r in (*project["dependencies"], *extra)]


def image_packages(path: Path = HERE / "image_packages.txt") -> dict[str, str | None]:
    """{canonical name: version or None where it was not recorded}."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version or None
    return out


def applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**TARGET_MARKERS, "extra": e}) for e in (extras or {""}))


def _pip_target_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp", "--abi", "cp312"]
    args += ["--abi", "abi3", "--abi", "none"]
    for tag in PLATFORMS:
        args += ["--platform", tag]
    return args


def index_source(wanted: dict[str, SpecifierSet]) -> dict[str, Dist]:
    """Newest version meeting each specifier, from the index's metadata (no wheel downloads)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        specs = [f"{name}{spec}" for name, spec in sorted(wanted.items())]
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q"]
        cmd += ["--report", str(report), "--target", str(Path(tmp) / "t"), *_pip_target_args(), *specs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
            raise RuntimeError(f"pip could not resolve {' '.join(specs)}: {' '.join(errors)[:500]}")
        items = json.loads(report.read_text())["install"]
    return {
        canonicalize_name(i["metadata"]["name"]): Dist(
            i["metadata"]["name"],
            i["metadata"]["version"],
            i["metadata"].get("requires_dist", []),
            i["download_info"]["url"],
        )
        for i in items
    }


def wheel_metadata(path: Path) -> Dist:
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    return Dist(meta["Name"], meta["Version"], meta.get_all("Requires-Dist") or [], str(path))


def folder_source(folder: Path):
    """The wheels of a gathered folder, by canonical name (one version each, or the folder is wrong)."""
    found: dict[str, list[Path]] = {}
    for wheel in sorted(folder.glob("*.whl")):
        found.setdefault(canonicalize_name(parse_wheel_filename(wheel.name)[0]), []).append(wheel)

    def source(wanted: dict[str, SpecifierSet]) -> dict[str, Dist]:
        return {n: wheel_metadata(found[n][-1]) for n in wanted if n in found}

    return source, found


def walk(source, image: dict[str, str | None], roots: list[Requirement], missing: str = "") -> Plan:
    """Follow requirements from `roots`, choosing versions through `source` (a function from
    {name: specifier} to the Dists it has), until every reachable name is placed. `missing` says where
    a name the source lacks was looked for."""
    missing = missing or f"no wheel for CPython {PYTHON} on x86-64 Linux"
    plan = Plan()
    specs: dict[str, SpecifierSet] = {}
    extras: dict[str, set[str]] = {}
    failed: set[str] = set()  # reported once, never asked again
    queue = list(roots)
    while queue:
        for req in queue:
            name = canonicalize_name(req.name)
            name = SAME_MODULE.get(name, name)
            specs[name] = specs.get(name, SpecifierSet()) & req.specifier
            extras.setdefault(name, set()).update(req.extras)
        queue = []
        wanted = {}
        for name, spec in specs.items():
            if name in LEFT_OUT:
                plan.left_out[name] = LEFT_OUT[name]
            elif name in image and name not in CARRY_ANYWAY:
                plan.image[name] = image[name]
                if image[name] and not spec.contains(Version(image[name]), prereleases=True):
                    failed.add(name)
                    problem = f"{name}: the image has {image[name]}, vidforge's tree needs {spec}"
                    if problem not in plan.problems:
                        plan.problems.append(problem)
            elif name in failed:
                continue
            elif name not in plan.carried or not spec.contains(
                Version(plan.carried[name].version), prereleases=True
            ):
                wanted[name] = spec
        if not wanted:
            break
        got = source(wanted)
        for name, spec in wanted.items():
            dist = got.get(name)
            if dist is None or not spec.contains(Version(dist.version), prereleases=True):
                failed.add(name)
                have = f" (found {dist.version})" if dist else ""
                plan.problems.append(f"{name}{spec}: {missing}{have}")
                continue
            plan.carried[name] = dist
            extra = extras.get(name, set())
            queue += [r for r in map(Requirement, dist.requires) if applies(r, extra)]
    return plan


def project_wheel(dest: Path) -> Path:
    """vidforge's own wheel, built from the checkout (pure Python; gives the `vidforge` command there)."""
    for old in dest.glob("vidforge-*.whl"):
        old.unlink()
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dest),
        str(ROOT),
    ]
    subprocess.run(cmd, check=True)
    return next(dest.glob("vidforge-*.whl"))


def gather(dest: Path) -> Plan:
    plan = walk(index_source, image_packages(), project_requirements())
    if plan.problems:
        return plan
    dest.mkdir(parents=True, exist_ok=True)
    keep = {canonicalize_name(n) for n in plan.carried}
    for wheel in dest.glob("*.whl"):  # one version of each: two would stop the whole install there
        name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        if name not in keep or parse_wheel_filename(wheel.name)[1] != Version(plan.carried[name].version):
            wheel.unlink()
    pins = [f"{d.name}=={d.version}" for d in plan.carried.values()]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "-d",
        str(dest),
        *_pip_target_args(),
        *pins,
    ]
    subprocess.run(cmd, check=True)
    project_wheel(dest)
    return verify(dest)


def verify(folder: Path) -> Plan:
    """The completeness check of a gathered folder, offline: the same walk over its wheels' metadata."""
    source, found = folder_source(folder)
    plan = walk(source, image_packages(), project_requirements(), f"not in {folder}")
    for name, wheels in found.items():
        if len(wheels) > 1:
            plan.problems.append(
                f"{name}: {len(wheels)} wheels ({', '.join(w.name for w in wheels)}); keep one"
            )
    if "vidforge" not in found:
        plan.problems.append("vidforge's own wheel is missing (python bench/gpu/gather.py builds it)")
    size = sum(w.stat().st_size for ws in found.values() for w in ws)
    if size > CARRY_LIMIT:
        plan.problems.append(f"the folder holds {size / 2**20:.0f} MiB; a device call carries at most 64 MiB")
    return plan


def installed() -> Plan:
    """On the device: the same walk over what this Python can import (image + installed wheels)."""
    from importlib import metadata

    def source(wanted: dict[str, SpecifierSet]) -> dict[str, Dist]:
        out = {}
        for name in wanted:
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue
            out[name] = Dist(name, dist.version, dist.requires or [], "installed")
        return out

    # The gpu extra is optional here: without torchao the FP8 test skips and says so.
    return walk(source, {}, project_requirements(gpu_extra=False), "not installed for this Python")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="resolve from metadata only; download nothing")
    mode.add_argument("--verify", action="store_true", help="check the gathered folder, offline")
    mode.add_argument("--installed", action="store_true", help="check this Python's installed packages")
    ap.add_argument("--dest", type=Path, default=DEST, help="the wheels folder (default .gpu-wheels/)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)
    if args.check:
        plan = walk(index_source, image_packages(), project_requirements())
    elif args.verify:
        plan = verify(args.dest)
    elif args.installed:
        plan = installed()
    else:
        plan = gather(args.dest)
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        carried = ", ".join(f"{n} {d.version}" for n, d in sorted(plan.carried.items()))
        print(f"carried ({len(plan.carried)}): {carried}")
        print(f"from the image ({len(plan.image)}): {', '.join(sorted(plan.image))}")
        for name, why in plan.left_out.items():
            print(f"left out: {name}: {why}")
    for problem in plan.problems:
        print(f"incomplete: {problem}", file=sys.stderr)
    return 1 if plan.problems else 0


if __name__ == "__main__":
    sys.exit(main())
