"""Typed overrides (`vidforge.profile.overrides`): code passes values, the command line passes `--set` text
read once as YAML, and what vidforge writes back as `--set` reads back to the same value."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from vidforge.profile import load_profile
from vidforge.profile.loading import ProfileError
from vidforge.profile.overrides import Override, command_line, parse_set, set_args, set_text

HOSTILE = 'wan #2: "it\'s"'
VALUES = [HOSTILE, "/x/wan #2", "true", "1e-4", "null", "a, b", "", "  x", "é", 3, 1e-4, True, None, [1, 2]]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_an_override_written_as_set_reads_back_to_its_value(value) -> None:
    text = set_text(Override("tokenizer.path", value))
    assert parse_set(text).value == value and type(parse_set(text).value) is type(value)
    # and through a shell: the argument the user pastes is the one parse_set reads
    assert shlex.split(command_line(*set_args({"tokenizer.path": value}))) == ["--set", text]


def test_a_typed_path_is_the_profiles_string_unparsed() -> None:
    assert load_profile(None, {"tokenizer.path": HOSTILE}).tokenizer.path == HOSTILE


def test_a_set_whose_value_yaml_would_cut_at_a_comment_is_refused_with_the_quoted_fix() -> None:
    # the command line's text is YAML: unquoted, ` #` starts a comment (why code never builds that text)
    with pytest.raises(ProfileError) as refused:
        load_profile(None, ["tokenizer.path=/data/wan #2"])
    said = str(refused.value)
    assert "the value would be '/data/wan'" in said and "\n" not in said
    fix = shlex.split(said.split("quote the value to keep it: ", 1)[1])
    assert load_profile(None, fix[1:]).tokenizer.path == "/data/wan #2"
    assert load_profile(None, ["tokenizer.path=/data/wan#2"]).tokenizer.path == "/data/wan#2"


def test_a_refused_set_is_named_as_the_user_typed_it() -> None:
    with pytest.raises(ProfileError, match=r"^--set parallel\.tp=two: "):
        load_profile(None, ["parallel.tp=two"])
    with pytest.raises(ProfileError, match="expected section.field=value"):
        load_profile(None, ["parallel.tp"])


def test_a_later_override_does_not_edit_an_earlier_ones_value() -> None:
    lora = {"rank": 16, "alpha": 16}
    profile = load_profile(None, [Override("train.lora", lora), "train.lora.rank=8"])
    assert profile.train.lora.rank == 8 and lora == {"rank": 16, "alpha": 16}


SRC = Path(__file__).resolve().parents[2] / "src" / "vidforge"
# --set texts a user types: the command line's own module, and the test helpers' settings, which tests pass
# to the commands as a user would
TEXT_ALLOWED = {"cli", "data/testing.py"}


def _literal(node: ast.AST) -> str | None:
    """A string literal's text, an f-string's with `{}` for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _fed(nodes: list[ast.AST]) -> list[ast.AST]:
    """The expressions that hold settings when code builds them: the items of a list, tuple or set
    display (not one unpacked into names: `a, b = x, y`), and the arguments of an `append`/`extend`/`insert` or of a profile or override function."""
    fed: list[ast.AST] = []
    unpacked = {
        id(n.value) for n in nodes if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Tuple)
    }
    for node in nodes:
        if isinstance(node, ast.List | ast.Tuple | ast.Set) and id(node) not in unpacked:
            fed += node.elts
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("append", "extend", "insert") or "profile" in name or "override" in name:
                fed += [*node.args, *(k.value for k in node.keywords)]
    return fed


def test_src_builds_no_override_text() -> None:
    """A `section.field=value` string with no space in it, held in a list or passed where settings go, is a
    setting as text (`[f"curation.fps={fps}"]`), which a YAML read would cut or retype: code passes an
    Override or a mapping instead. (Messages that name a setting, `model.family=wan: ...`, hold spaces.)"""
    from vidforge.profile.run_profile import RunProfile

    setting = re.compile(rf"^({'|'.join(RunProfile.model_fields)})(\.[a-z_0-9]+)*=\S*$")
    found = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where.split("/")[0] in TEXT_ALLOWED or where in TEXT_ALLOWED:
            continue
        for node in _fed(list(ast.walk(ast.parse(path.read_text())))):
            text = _literal(node)
            if text is not None and setting.match(text):
                found.append(f"{where}:{node.lineno}: {text}")
    assert not found, found
