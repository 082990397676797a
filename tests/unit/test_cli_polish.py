"""What a user sees at the edges of every command (issue 44 item 9): a closed output pipe (`| head`) ends a
command quietly, usage lines name their arguments click-style (`VIDEOS`, not `{videos}`), and a misspelt
profile field or section is reported against the `--set` that misspelt it, with the nearest valid name."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from vidforge.cli.app import app
from vidforge.profile import load_profile
from vidforge.profile.loading import ProfileError

# A command that writes more than a pipe holds, under the root group's error boundary, run with its stdout
# a pipe whose reader has gone; and one whose broken pipe is not stdout's (a socket's), which is a failure.
_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from vidforge.cli.app import app

    @app.command("flood")
    def flood():
        for _ in range(100):
            sys.stdout.write("x" * 100_000 + "\\n")
            sys.stdout.flush()

    @app.command("socket")
    def socket():
        raise BrokenPipeError(32, "Broken pipe")

    if sys.argv[1] == "flood":
        read, write = os.pipe()
        os.close(read)
        os.dup2(write, 1)
    app(sys.argv[1:], prog_name="vidforge")
    """
)


@pytest.mark.parametrize("name", ["flood", "socket"])
def test_a_closed_pipe_ends_quietly_and_another_broken_pipe_is_a_failure(name) -> None:
    run = subprocess.run([sys.executable, "-c", _SCRIPT, name], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    if name == "flood":
        assert run.stderr == ""  # was: error: BrokenPipeError: [Errno 32] Broken pipe
    else:
        assert "error: BrokenPipeError" in run.stderr


def test_usage_lines_name_arguments_click_style() -> None:
    for words, usage in (
        (["finetune"], "[OPTIONS] VIDEOS"),
        (["clip"], "[OPTIONS] INPUTS..."),
        (["model", "import"], "[OPTIONS] SRC"),
    ):
        result = CliRunner().invoke(app, [*words, "--help"])
        assert result.exit_code == 0 and usage in result.output, result.output
        assert "{" not in result.output.split("Usage:")[1].splitlines()[0]


def test_a_misspelt_field_is_reported_against_its_own_set_with_the_nearest_name() -> None:
    # finetune puts its LoRA defaults before the user's --set: the error names the user's, not the whole
    # `train.lora={...}` value
    with pytest.raises(ProfileError) as err:
        load_profile(None, ["train.lora={rank: 16, alpha: 16}", "train.lora.rnak=8"])
    assert str(err.value) == "--set train.lora.rnak=8: unknown field; did you mean rank?"
    with pytest.raises(
        ProfileError, match=r"^--set train.lra.rank=8: train.lra: unknown field; did you mean lora\?$"
    ):
        load_profile(None, ["train.lra.rank=8"])
    with pytest.raises(
        ProfileError, match=r"--set tarin.steps=2: tarin: unknown field; did you mean train\?"
    ):
        load_profile(None, ["tarin.steps=2"])
    with pytest.raises(ProfileError, match=r"unknown field; valid fields here: steps, micro_batch"):
        load_profile(None, ["train.zzzqq=1"])  # nothing near: every valid name


def test_a_misspelt_field_in_a_file_gets_the_nearest_name(tmp_path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("model:\n  layrs: 3\ntrain:\n  lora:\n    alpah: 4\n")
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert "model.layrs: unknown field; did you mean layers?" in str(err.value)
    assert "train.lora.alpah: unknown field; did you mean alpha?" in str(err.value)
