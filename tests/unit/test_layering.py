"""Imports go down the layers, never up, and no modules import each other in a circle. Every package and
top-level module of src/vidforge has its place in LAYERS (bottom first); a module may import its own
package and anything on a lower layer, never a package beside it on its layer or above it. Checked on
every import statement, lazy ones inside functions and those under `if TYPE_CHECKING:` included (a
type-only import is still a dependency of the design).

A model family's package (`families/<name>/`) sits on two layers. Its spec, the package's `__init__` and
the modules of the package it imports, is torch-free data the profile reads: the `families` layer, below
the profile. Every other module of the package (the network, its weights, its tensor-parallel plan, its
conditioning) is the family's code, on the `family code` layer: it builds on models, weights, parallel and
tokenizers, and is reached only by the "module:attribute" strings of its spec (`families.load`), so no
module outside the package imports it (nor the spec's modules: the rest of vidforge asks
`families.family(name)`).

A known exception names the issue that removes it; when it is no longer needed the test says so, so the
list only shrinks."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"

# Bottom first. Names on one layer are peers: they know nothing of each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the registry of objectives and samplers: names and module paths, which the profile validates against;
    # the base of every profile section (the families' model sections derive from it too)
    ("errors", "__init__", "sampler_registry", "section"),
    ("families",),  # each family's facts, its code named by import path (the profile reads them)
    ("profile", "memory", "weights_file", "device", "files", "token_grid"),  # profile: pure data, no torch
    ("tokens", "text"),  # token rows as host data; text encoders
    ("attention",),  # the attention dispatcher and its sparse kernels: every network's attention calls it
    # weightless math; networks; their adapters; what trades time for memory; data, which knows no model
    ("diffusion", "models", "lora", "memory_savers", "data"),
    ("parallel", "weights"),  # parallel: applied to an unmodified model from outside; weights: its files
    ("curate", "estimate", "tokenizers"),
    ("family code",),  # each family's network, weights, TP plan, conditioning: loaded by import path
    ("sampling",),  # the sampling loop, its latents and writers: training's validation and infer share it
    ("train", "infer"),  # what both need (sampling, adapters) sits below them
    ("bench", "review"),
    ("finetune",),  # composes the stages: above them all
    ("cli",),
    ("__main__",),
)

# (importing module, imported module) -> the issue that removes the import.
KNOWN: dict[tuple[str, str], str] = {}

# (importing module, imported module of a family package) -> the issue that removes the import.
KNOWN_FAMILY: dict[tuple[str, str], str] = {}

# Finer rules than the layers: (package or module) -> names it must not import.
FORBIDDEN = {
    "profile": ("torch",),
    "diffusion": ("torch.distributed",),
    # the profile reads the registry while it loads: neither it nor the package's __init__ imports torch
    "diffusion/__init__.py": ("torch", "vidforge"),
    "sampler_registry.py": ("torch", "vidforge"),
    "section.py": ("torch", "vidforge"),
    "diffusion/edm.py": ("vidforge.profile",),
    "diffusion/objective.py": ("vidforge.profile",),
    "tokens": ("torch.distributed",),
    # the family registry sits below the profile: names and data, its code loaded by import path (each
    # family's spec modules: `test_family_specs_import_no_torch`)
    "families/__init__.py": ("torch",),
}


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(SRC.rglob("*.py"))}


def _imported(path: Path) -> list[str]:
    """Every name an import statement in `path` names (for `from a import b`: a.b, and a unless every
    name imported is a module of a)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            named = [f"{node.module}.{alias.name}" for alias in node.names]
            # `from package import module` uses the module alone: the package's __init__ runs too, and the
            # finer rules keep the ones that must stay light (diffusion's) from importing anything
            if any(name not in MODULES for name in named):
                names.append(node.module)
            names += named
    return names


def _resolve(name: str) -> str | None:
    """The vidforge module an imported name lives in (the longest module prefix), else None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


@functools.cache  # parsed once per process: every test reads the same graph
def _edges() -> dict[str, frozenset[str]]:
    edges: dict[str, frozenset[str]] = {}
    for module, path in MODULES.items():
        found = {_resolve(n) for n in _imported(path) if n == "vidforge" or n.startswith("vidforge.")}
        edges[module] = frozenset(m for m in found if m is not None and m != module)
    return edges


FAMILY_PACKAGES = sorted(_module(p) for p in (SRC / "families").glob("*/__init__.py"))


@functools.cache
def _family_specs() -> frozenset[str]:
    """The modules of each family package's spec: its `__init__` and the package's modules it imports,
    transitively."""
    specs: set[str] = set()
    for package in FAMILY_PACKAGES:
        work = [package]
        while work:
            module = work.pop()
            if module not in specs:
                specs.add(module)
                work += [t for t in _edges()[module] if t.startswith(package + ".")]
    return frozenset(specs)


def _family_package(module: str) -> str | None:
    """The family package a module belongs to, else None."""
    return next((p for p in FAMILY_PACKAGES if module == p or module.startswith(p + ".")), None)


def _unit(module: str) -> str:
    """The name LAYERS places a module under: `family code` for a family package's modules outside its
    spec; else the longest prefix LAYERS names (a module placed apart from its package), else its
    top-level package or module (`vidforge` is __init__)."""
    if _family_package(module) and module not in _family_specs():
        return "family code"
    parts = module.split(".")[1:]
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in LEVEL:
            return ".".join(parts[:n])
    return parts[0] if parts else "__init__"


LEVEL = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def test_every_package_has_a_layer() -> None:
    units = {_unit(m) for m in MODULES}
    assert sorted(units - set(LEVEL)) == [], "place each new package or module in LAYERS"
    assert sorted(set(LEVEL) - units) == [], "LAYERS names a package that is gone"


def test_imports_only_go_down() -> None:
    bad = []
    for module, targets in sorted(_edges().items()):
        for target in sorted(targets):
            a, b = _unit(module), _unit(target)
            if a != b and LEVEL[b] >= LEVEL[a] and (module, target) not in KNOWN:
                where = "beside it" if LEVEL[b] == LEVEL[a] else "above it"
                bad.append(f"{module} imports {target} ({b} is {where})")
    assert bad == []


def _cycles(edges: dict[str, set[str]] | dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    """No modules import each other in a circle. A package's __init__ importing its own modules is not
    counted: importing any module of a package runs its __init__ first anyway."""
    edges = {
        module: {
            t for t in targets if not (MODULES[module].name == "__init__.py" and t.startswith(module + "."))
        }
        for module, targets in _edges().items()
    }
    edges = {m: {t for t in ts if (m, t) not in KNOWN} for m, ts in edges.items()}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_known_exceptions_are_still_needed() -> None:
    edges = _edges()
    stale = [f"{a} -> {b}" for (a, b) in KNOWN if b not in edges.get(a, set())]
    assert stale == [], "these imports are gone: remove them from KNOWN"


@pytest.mark.parametrize("where", sorted(FORBIDDEN))
def test_finer_rules(where: str) -> None:
    target = SRC / where
    files = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
    assert files
    bad = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in files
        for name in _imported(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[where])
    ]
    assert bad == []


def test_a_family_package_is_its_spec_below_the_profile_and_its_code_above_parallel() -> None:
    assert "vidforge.families.wan" in FAMILY_PACKAGES
    assert _unit("vidforge.families.wan") == _unit("vidforge.families.wan.experts") == "families"
    assert (
        _unit("vidforge.families.wan.network")
        == _unit("vidforge.families.wan.tensor_parallel")
        == "family code"
    )
    assert LEVEL["families"] < LEVEL["profile"] and LEVEL["family code"] > LEVEL["parallel"]


def test_family_specs_import_no_torch() -> None:
    """What the profile reads of a family (its spec's modules) loads no network code."""
    bad = [
        f"{module} imports {name}"
        for module in sorted(_family_specs())
        for name in _imported(MODULES[module])
        if name == "torch" or name.startswith("torch.")
    ]
    assert bad == []


def test_nothing_outside_a_family_package_imports_it() -> None:
    """The rest of vidforge reaches a family through `families.family(name)` and the code its spec names,
    never by importing the family's modules."""
    bad = []
    for module, targets in sorted(_edges().items()):
        for target in sorted(targets):
            package = _family_package(target)
            if package and _family_package(module) != package and (module, target) not in KNOWN_FAMILY:
                bad.append(f"{module} imports {target}")
    assert bad == []


def test_known_family_exceptions_are_still_needed() -> None:
    edges = _edges()
    stale = [f"{a} -> {b}" for (a, b) in KNOWN_FAMILY if b not in edges.get(a, set())]
    assert stale == [], "these imports are gone: remove them from KNOWN_FAMILY"
