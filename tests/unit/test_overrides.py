"""Typed overrides (`vidforge.profile.overrides`): code passes values, the command line passes `--set` text
read once as YAML, and what vidforge writes back as `--set` reads back to the same value."""

from __future__ import annotations

import shlex

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
