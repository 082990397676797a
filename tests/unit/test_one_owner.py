"""One owner for each decision: a scan of src/vidforge finds each decision made in its owner's file and
nowhere else. Device choice (`auto` resolved to a GPU or the CPU), meshes and process groups, FSDP, the
training compute dtype, the file types read as videos, where a run folder's weights are, whether tensor
parallel splits the sequence and the first-frame share of a model that keeps both of its tasks. Each
pattern is held to the second copies this scan was written against (`SECOND_COPIES`), so a pattern that can
no longer see them fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"

# decision -> (its owner, relative to src/vidforge; the lines that make it)
OWNERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "device choice": (
        "device.py",
        (
            r"""["']cuda["']\s+if\s+(not\s+)?torch\.cuda\.is_available\(\)""",
            r"""==\s*["']auto["'].*torch\.cuda\.is_available\(\)""",
            r"""def \w*_device\(""",
        ),
    ),
    "meshes and process groups": (
        "parallel/dims.py",
        (r"init_device_mesh\(", r"\bDeviceMesh\(", r"new_subgroups_by_enumeration\(", r"\bnew_group\("),
    ),
    "FSDP": ("parallel/fsdp.py", (r"\bfully_shard\(",)),
    "compute dtype": ("parallel/parallelize.py", (r"torch\.bfloat16 if .*precision",)),
    "video extensions": ("profile/data.py", (r"""["']\.?mp4["'].*["']\.?(webm|mkv|mov|avi)["']""",)),
    # a published model that keeps text- and image-to-video: the share of clips conditioned on a first frame
    "both tasks' image condition": (
        "families/both_tasks.py",
        (r"""image_condition["']?\s*[:=]\s*0?\.5\b""", r"_CONDITION\s*=\s*0?\.5\b"),
    ),
    # parallel.sequence_parallel unset is the family's choice: a reader of the field itself would take it off
    "sequence parallel": (
        "profile/layout_rules.py",
        (r"\w\.parallel\.sequence_parallel\b", r"\bpar\.sequence_parallel\b"),
    ),
    # a run folder's weights: RUN/export, a finetune run's RUN/train/export, or the folder itself
    "where a run's weights are": (
        "files.py",
        (
            r"""return \w+ / ["']export["'],""",
            r"""for \w+ in \((\w+, )?\w+ / ["']export["'](, \w+)?\):""",
            r"""/ ["']export["'] / CONFIG\)\.is_file\(\)""",
        ),
    ),
}

# What the scan was written against: the second copies it replaced (each must be seen).
SECOND_COPIES = {
    "device choice": (
        'return torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        'if choice == "auto" and torch.cuda.is_available():',
        "def resolve_device(name: str) -> str:",
    ),
    "meshes and process groups": ("mesh = init_device_mesh(runtime.device.type, (runtime.world,))",),
    "FSDP": ("        fully_shard(module, mesh=mesh)",),
    "compute dtype": ('param_dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32',),
    "video extensions": ('media = [e for e in members if e in ("mp4", "webm", "mkv", "mov", "avi")]',),
    "both tasks' image condition": (
        'TI2V_DEFAULTS = {"diffusion.image_condition": 0.5}',
        "IMAGE_TO_VIDEO_CONDITION = 0.5",
    ),
    "sequence parallel": (
        'plan(model, dims.mesh["tp"], sequence_parallel=profile.parallel.sequence_parallel)',
        "sp = tp if par.sequence_parallel else 1",
        "if layout.tp > 1 and profile.parallel.sequence_parallel:",
    ),
    "where a run's weights are": (
        'return folder / "export", folder / FINETUNE_TRAIN / "export", folder',
        'for candidate in (path / "export", path):',
        'for folder in (export_dir, export_dir / "export"):',
        'if not (export / CONFIG).is_file() and (export / "export" / CONFIG).is_file():',
    ),
}


def _makes(text: str, decision: str) -> list[str]:
    patterns = [re.compile(p) for p in OWNERS[decision][1]]
    return [line.strip() for line in text.splitlines() if any(p.search(line) for p in patterns)]


@pytest.mark.parametrize("decision", sorted(OWNERS))
def test_one_owner_makes_the_decision(decision: str) -> None:
    owner = OWNERS[decision][0]
    assert _makes((SRC / owner).read_text(), decision), f"{owner} no longer makes the {decision}"
    seconds = {
        f"{path.relative_to(SRC)}: {line}"
        for path in sorted(SRC.rglob("*.py"))
        if str(path.relative_to(SRC)) != owner
        for line in _makes(path.read_text(), decision)
    }
    assert sorted(seconds) == [], f"call {owner} instead"


@pytest.mark.parametrize("decision", sorted(SECOND_COPIES))
def test_the_scan_sees_a_second_copy(decision: str) -> None:
    assert all(_makes(line, decision) for line in SECOND_COPIES[decision])


# Output files have one writer, vidforge/files.py (issue 46): a temporary it created, O_NOFOLLOW, renamed
# over the final name, in a folder that is no symbolic link. A write by name anywhere else (a path's
# write_text, open(..., "w"), os.replace of a hand-made temporary, a library saving to a path) is a
# second copy of that rule, unless it writes the `tmp` the writer handed out.
RAW_WRITES = (
    r"os\.replace\(",
    r"(?<!tmp)\.write_(?:text|bytes)\(",
    r"""(?<![.\w])open\((?!tmp\b).*,\s*(?:mode=)?["'][wax]b?\+?["']""",
    r"\bsave_file\((?!.*\btmp\b)",
    r"\.savefig\((?!tmp\b)",
    r"""\bav\.open\((?!str\(tmp\)).*["']w["']""",
)
# Raw writes left, by file, with why; each must still be seen (the list only shrinks).
RAW_WRITES_LEFT = {
    "curate/caption.py": "hard-links a clip into OUT/clips (a link then a rename, no bytes written)",
    "curate/clipping/transcode.py": "renames the encoder's finished file (curation's: issue 46 item 13's owner)",
    "curate/video/encoder.py": "the encoder writes where transcode's atomic_path points (curation's)",
}


def _raw_writes(text: str) -> list[str]:
    patterns = [re.compile(p) for p in RAW_WRITES]
    return [line.strip() for line in text.splitlines() if any(p.search(line) for p in patterns)]


def test_output_files_are_written_by_the_one_writer() -> None:
    found = {
        str(path.relative_to(SRC)): _raw_writes(path.read_text())
        for path in sorted(SRC.rglob("*.py"))
        if str(path.relative_to(SRC)) != "files.py"
    }
    seconds = [
        f"{name}: {line}" for name, lines in found.items() if name not in RAW_WRITES_LEFT for line in lines
    ]
    assert seconds == [], "write through vidforge.files (atomic_path, atomic_file, write_text, write_bytes)"
    assert [name for name in RAW_WRITES_LEFT if not found.get(name)] == [], "no raw write left: drop it here"


def test_the_raw_write_scan_sees_each_kind() -> None:
    for line in (
        '(run_dir / "profile.yaml").write_text(dump_profile(profile))',
        "os.replace(tmp_weights, out / WEIGHTS)",
        'with open(result.csv_path, "w", newline="", encoding="utf-8") as f:',
        'save_file(tensors, str(out / "model.safetensors"))',
        'fig.savefig(out / f"{stem}.png", dpi=80)',
        'with av.open(str(path), "w") as container:',
    ):
        assert _raw_writes(line), line
    assert not _raw_writes('with atomic_path(path) as tmp, open(tmp, "wb") as f:')
