"""The half of the GPU suite that runs here: gather, for the device's Python, the wheels of every
runtime dependency of vidforge that the device image lacks, plus vidforge's own wheel, into an ignored
folder that travels with the working tree (`carry`); and check that folder for completeness.

    python bench/gpu/gather.py                 # download the locked wheels into .gpu-wheels/, verify
    python bench/gpu/gather.py --check         # the lock still completes the tree (index metadata only)
    python bench/gpu/gather.py --verify        # check an already gathered folder against the lock, offline
    python bench/gpu/gather.py --lock          # resolve the newest set, download it, rewrite wheels.lock
    python bench/gpu/gather.py --installed     # on the device: check what is importable there
    python bench/gpu/gather.py --extra gpu-decode [--check|--verify|--lock]
                                               # an extra's own set (EXTRA_SETS) -> .gpu-wheels-gpu-decode/

The set is pinned in `wheels.lock` (pip's requirements format: name==version --hash=sha256:..., with the
wheel's file name and size as a comment), so a gather fetches the same bytes every day whatever the
index serves newest; `--lock` is the one place the set changes.

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
import hashlib
import json
import shutil
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
LOCK = HERE / "wheels.lock"
CARRY_LIMIT = 64 * 2**20  # what travels with one device call, the working tree included
WHEELS_BUDGET = 60 * 2**20  # the wheels' share of it: the checkout (src, tests, docs) takes ~3 MiB

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
    # The walk stops here, so s3fs's client (aiobotocore, botocore ~16 MB, aioitertools, jmespath) stays
    # out too: with it the set was 71 MiB, over what a device call carries.
    "s3fs": "only shards on object storage (`--data s3://...`) need it; the suite reads local folders, "
    "and the object-storage tests skip without it",
}
# Requirements met by another distribution of the same module: scenedetect asks for opencv-python, and
# the image's opencv-python-headless installs the same `cv2` (without the GUI, which nothing here uses).
SAME_MODULE = {"opencv-python": "opencv-python-headless"}
# Extras gathered as sets of their own (`--extra NAME`: wheels-NAME.lock, .gpu-wheels-NAME/), each carried
# in a device call of its own: PyNvVideoCodec's wheel (27 MB) beside the base set (54 MiB) is over the
# 64 MiB one call carries. run.sh installs every gathered set into the same site folder, which stays while
# the machine is held, so a call carrying `.gpu-wheels-gpu-decode` first and then one carrying
# `.gpu-wheels` find both installed. Each set is walked on top of the image and the base lock.
EXTRA_SETS = {
    "gpu-decode": "PyNvVideoCodec (NVDEC) for `vidforge clip` with curation.decode_device=cuda",
}
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
    size_bytes: int | None = None  # the wheels' total, where the plan is of a folder or a lock

    def as_dict(self) -> dict:
        return {
            "python": PYTHON,
            "image": self.image,
            "carried": {n: d.version for n, d in sorted(self.carried.items())},
            "left_out": self.left_out,
            "problems": self.problems,
            "size_mib": None if self.size_bytes is None else round(self.size_bytes / 2**20, 1),
            "complete": not self.problems,
        }


def project_requirements(
    gpu_extra: bool = True, pyproject: Path = ROOT / "pyproject.toml"
) -> list[Requirement]:
    """`dependencies`, and the `gpu` extra (torchao for FP8; flash-attn, which LEFT_OUT names)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extra = project["optional-dependencies"]["gpu"] if gpu_extra else []
    return [Requirement(r) for r in (*project["dependencies"], *extra)]


def lock_path(extra: str | None = None) -> Path:
    return LOCK if extra is None else HERE / f"wheels-{extra}.lock"


def dest_path(extra: str | None = None) -> Path:
    return DEST if extra is None else ROOT / f".gpu-wheels-{extra}"


def roots(extra: str | None = None, pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """What a set completes: vidforge's dependencies and `gpu` extra, or one extra of EXTRA_SETS."""
    if extra is None:
        return project_requirements(pyproject=pyproject)
    if extra not in EXTRA_SETS:
        raise ValueError(f"--extra {extra!r}: one of {', '.join(EXTRA_SETS)}")
    project = tomllib.loads(pyproject.read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"][extra]]


def provided(extra: str | None = None) -> dict[str, str | None]:
    """What a set's walk stops at: the image, and for an extra's set the base lock too (installed first)."""
    image = image_packages()
    if extra is None:
        return image
    return {**image, **{n: p.version for n, p in read_lock().items()}, "vidforge": None}


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


def _pip_report(lines: list[str]) -> list[dict]:
    """pip's resolution of requirement lines (a requirements file: `name==version --hash=...` lines
    turn on pip's hash checking) for the target, from the index's metadata files: no wheel downloads."""
    with tempfile.TemporaryDirectory() as tmp:
        report, reqs = Path(tmp) / "report.json", Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(lines) + "\n")
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q"]
        cmd += ["--report", str(report), "--target", str(Path(tmp) / "t"), *_pip_target_args()]
        proc = subprocess.run([*cmd, "-r", str(reqs)], capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
            raise RuntimeError(f"pip could not resolve {' '.join(lines)}: {' '.join(errors)[:500]}")
        return json.loads(report.read_text())["install"]


def _dists(items: list[dict]) -> dict[str, Dist]:
    return {
        canonicalize_name(i["metadata"]["name"]): Dist(
            i["metadata"]["name"],
            i["metadata"]["version"],
            i["metadata"].get("requires_dist", []),
            i["download_info"]["url"],
        )
        for i in items
    }


def index_source(wanted: dict[str, SpecifierSet]) -> dict[str, Dist]:
    """Newest version meeting each specifier, from the index's metadata (no wheel downloads)."""
    return _dists(_pip_report([f"{name}{spec}" for name, spec in sorted(wanted.items())]))


@dataclass(frozen=True)
class Pin:
    """One line of wheels.lock: the exact wheel file a gather downloads for a name."""

    name: str
    version: str
    sha256: str
    filename: str
    size: int

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


def read_lock(path: Path = LOCK) -> dict[str, Pin]:
    """{canonical name: Pin}; empty when there is no lock."""
    pins: dict[str, Pin] = {}
    if not path.exists():
        return pins
    for line in path.read_text().splitlines():
        requirement, _, comment = line.partition("#")
        if not requirement.strip():
            continue
        spec, _, digest = requirement.strip().partition(" --hash=sha256:")
        name, _, version = spec.partition("==")
        filename, size = comment.split()
        pins[canonicalize_name(name)] = Pin(name, version, digest, filename, int(size))
    return pins


def write_lock(pins: dict[str, Pin], path: Path = LOCK, extra: str | None = None) -> None:
    total = sum(p.size for p in pins.values())
    what = (
        "every runtime dependency of vidforge"
        if extra is None
        else f"what the `{extra}` extra adds to wheels.lock"
    )
    tail = ", plus vidforge's own wheel (built from the checkout)" if extra is None else ""
    option = "" if extra is None else f" --extra {extra}"
    header = [
        f"# The device wheel set (bench/gpu/gather.py{option}): {what} that the device",
        "# image lacks, for CPython 3.12 on x86-64 Linux, one wheel file each. `gather.py` downloads exactly",
        f"# these (pip checks each sha256); `gather.py{option} --lock` resolves the newest set and rewrites this file.",
        f"# {len(pins)} wheels, {total / 2**20:.1f} MiB{tail}.",
    ]
    lines = [f"{p.requirement}  # {p.filename} {p.size}" for _, p in sorted(pins.items())]
    path.write_text("\n".join(header + lines) + "\n")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def lock_source(pins: dict[str, Pin]):
    """A walk source that offers each name at its locked version only: the index's metadata of exactly
    the locked file (pip refuses a file whose sha256 differs)."""

    def source(wanted: dict[str, SpecifierSet]) -> dict[str, Dist]:
        lines = [pins[n].requirement for n in sorted(wanted) if n in pins]
        return _dists(_pip_report(lines)) if lines else {}

    return source


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


def _download(requirements: list[str], dest: Path) -> None:
    """`pip download --no-deps` of requirement lines into `dest`, for the device's Python."""
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(requirements) + "\n")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest)]
        subprocess.run([*cmd, *_pip_target_args(), "-r", str(reqs)], check=True)


def gather(dest: Path, lock: Path = LOCK, extra: str | None = None) -> Plan:
    """Make `dest` hold exactly the locked wheels (downloading those it lacks; any other wheel goes, so
    one version of each travels) and, for the base set, vidforge's own, then verify it."""
    pins = read_lock(lock)
    if not pins:
        return Plan(problems=[f"{lock} is missing or empty: python bench/gpu/gather.py --lock writes it"])
    dest.mkdir(parents=True, exist_ok=True)
    by_file = {p.filename: p for p in pins.values()}
    for wheel in dest.glob("*.whl"):
        if wheel.name not in by_file or sha256_of(wheel) != by_file[wheel.name].sha256:
            wheel.unlink()
    missing = [p.requirement for p in pins.values() if not (dest / p.filename).exists()]
    if missing:
        _download(missing, dest)
    if extra is None:
        project_wheel(dest)
    return verify(dest, lock, extra)


def relock(dest: Path, lock: Path = LOCK, extra: str | None = None) -> Plan:
    """Resolve the newest complete set from the index, download it, write its pins to `lock`, and move
    the wheels into `dest` (then gather, which finds them there)."""
    plan = walk(index_source, provided(extra), roots(extra))
    if plan.problems:
        return plan
    with tempfile.TemporaryDirectory() as tmp:
        _download([f"{d.name}=={d.version}" for d in plan.carried.values()], Path(tmp))
        pins = {}
        for wheel in Path(tmp).glob("*.whl"):
            name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
            dist = plan.carried[name]
            pins[name] = Pin(dist.name, dist.version, sha256_of(wheel), wheel.name, wheel.stat().st_size)
        write_lock(pins, lock, extra)
        dest.mkdir(parents=True, exist_ok=True)
        for wheel in Path(tmp).glob("*.whl"):
            shutil.move(wheel, dest / wheel.name)
    return gather(dest, lock, extra)


def check(lock: Path = LOCK, extra: str | None = None) -> Plan:
    """The lock against vidforge's tree, from the index's metadata (no wheel downloads): the walk with
    every carried name at its locked version, so a lock that misses a name, pins a version a specifier
    refuses, or names a file the index no longer serves is a problem; so is a pin nothing needs."""
    pins = read_lock(lock)
    missing = f"not in {lock.name} (python bench/gpu/gather.py --lock)"
    plan = walk(lock_source(pins), provided(extra), roots(extra), missing)
    for name in sorted(set(pins) - set(plan.carried)):
        if not any(p.startswith(name) for p in plan.problems):
            plan.problems.append(f"{name}: pinned in {lock.name}, but nothing in vidforge's tree needs it")
    plan.size_bytes = sum(p.size for p in pins.values())
    return plan


def verify(folder: Path, lock: Path = LOCK, extra: str | None = None) -> Plan:
    """The completeness check of a gathered folder, offline: the same walk over its wheels' metadata;
    every wheel the lock's file with the lock's sha256; the folder within the wheels' budget."""
    source, found = folder_source(folder)
    plan = walk(source, provided(extra), roots(extra), f"not in {folder}")
    for name, wheels in found.items():
        if len(wheels) > 1:
            plan.problems.append(
                f"{name}: {len(wheels)} wheels ({', '.join(w.name for w in wheels)}); keep one"
            )
    if extra is None and "vidforge" not in found:
        plan.problems.append("vidforge's own wheel is missing (python bench/gpu/gather.py builds it)")
    pins = read_lock(lock)
    if not pins:
        plan.problems.append(f"{lock} is missing or empty: python bench/gpu/gather.py --lock writes it")
    by_file = {p.filename: p for p in pins.values()}
    for wheel in (w for name, ws in found.items() if name != "vidforge" for w in ws):
        pin = by_file.get(wheel.name)
        if pin is None:
            plan.problems.append(f"{wheel.name}: not the file {lock.name} pins; gather.py replaces it")
        elif sha256_of(wheel) != pin.sha256:
            plan.problems.append(f"{wheel.name}: its sha256 is not {lock.name}'s; gather.py replaces it")
    for pin in pins.values():
        if not (folder / pin.filename).exists():
            plan.problems.append(f"{pin.filename} ({lock.name}) is not in {folder}")
    plan.size_bytes = sum(w.stat().st_size for ws in found.values() for w in ws)
    if plan.size_bytes > WHEELS_BUDGET:
        plan.problems.append(
            f"the folder holds {plan.size_bytes / 2**20:.1f} MiB; the wheels' budget is "
            f"{WHEELS_BUDGET / 2**20:.0f} MiB of the {CARRY_LIMIT / 2**20:.0f} MiB a device call carries"
        )
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
    mode.add_argument(
        "--check", action="store_true", help="check wheels.lock against the tree (index metadata only)"
    )
    mode.add_argument(
        "--verify", action="store_true", help="check the gathered folder against the lock, offline"
    )
    mode.add_argument(
        "--lock", action="store_true", help="resolve the newest set, rewrite wheels.lock, gather"
    )
    mode.add_argument("--installed", action="store_true", help="check this Python's installed packages")
    ap.add_argument("--extra", choices=sorted(EXTRA_SETS), help="gather an extra's own set (EXTRA_SETS)")
    ap.add_argument("--dest", type=Path, help="the wheels folder (default .gpu-wheels/, .gpu-wheels-EXTRA/)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)
    dest, lock = args.dest or dest_path(args.extra), lock_path(args.extra)
    if args.check:
        plan = check(lock, args.extra)
    elif args.lock:
        plan = relock(dest, lock, args.extra)
    elif args.verify:
        plan = verify(dest, lock, args.extra)
    elif args.installed:
        plan = installed()
    else:
        plan = gather(dest, lock, args.extra)
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        carried = ", ".join(f"{n} {d.version}" for n, d in sorted(plan.carried.items()))
        print(f"carried ({len(plan.carried)}): {carried}")
        print(f"from the image ({len(plan.image)}): {', '.join(sorted(plan.image))}")
        for name, why in plan.left_out.items():
            print(f"left out: {name}: {why}")
        if plan.size_bytes is not None:
            print(f"size: {plan.size_bytes / 2**20:.1f} MiB (budget {WHEELS_BUDGET / 2**20:.0f} MiB)")
    for problem in plan.problems:
        print(f"incomplete: {problem}", file=sys.stderr)
    return 1 if plan.problems else 0


if __name__ == "__main__":
    sys.exit(main())
