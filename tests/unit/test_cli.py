"""The command line: output modes, exit codes and the one error boundary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from vidforge import __version__
from vidforge.cli._errors import GuardedGroup
from vidforge.cli._globals import hoist_global_flags
from vidforge.cli._output import Output, set_current_output
from vidforge.cli.app import app
from vidforge.errors import UserInputError

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_json_user_error_is_one_line_and_exit_2(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    result = invoke("--json", "profile", "validate", "--set", "parallel.tp=3")
    assert result.exit_code == 2
    start, event = map(json.loads, result.stdout.strip().splitlines())
    assert start == {"event": "start", "command": "profile validate", "version": __version__}
    assert event["event"] == "error" and event["kind"] == "user" and event["command"] == "profile validate"
    assert event["message"].startswith("--set parallel.tp=3: must divide model.heads=4, got 3")


def test_installed_console_script_gives_the_same_json_error() -> None:
    exe = Path(sys.executable).with_name("vidforge")
    proc = subprocess.run(
        [str(exe), "--json", "profile", "validate", "--set", "parallel.tp=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "VIDFORGE_PROFILE": ""},
    )
    assert proc.returncode == 2
    start, error = map(json.loads, proc.stdout.splitlines())
    assert start["event"] == "start" and error["kind"] == "user"


def test_human_user_error_goes_to_stderr(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    result = invoke("profile", "validate", "--set", "parallel.nope=1")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: --set parallel.nope=1: unknown field")  # the --set, not the file


def test_show_applies_overrides(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    result = invoke("profile", "show", "--profile", "dit1b_1xh200", "--set", "model.layers=6")
    assert result.exit_code == 0
    shown = yaml.safe_load(result.stdout)
    assert shown["model"]["layers"] == 6 and shown["model"]["hidden"] == 1536
    assert shown["cluster"]["accelerator"]["name"] == "h200"


def test_profile_env_var_selects_the_profile(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("VIDFORGE_PROFILE", "tiny_cpu4_tp2_cp2")
    _, event = map(json.loads, invoke("--json", "profile", "validate").stdout.splitlines())
    assert (event["profile"], event["tp"], event["cp"], event["world_size"]) == ("tiny_cpu4_tp2_cp2", 2, 2, 4)


def test_validate_many_reports_each_and_fails_if_any(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(ROOT)
    bad = tmp_path / "bad.yaml"
    bad.write_text("parallel: {tp: 3}\n")
    result = invoke("--json", "profile", "validate", "profiles/local_cpu.yaml", str(bad))
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["event"] for e in events] == ["start", "result", "error", "error"]
    assert result.exit_code == 2


@pytest.mark.parametrize(
    "args",
    [
        ["profile", "validate", "--set", "parallel.tp=3", "--json"],
        ["profile", "validate", "--json", "--set", "parallel.tp=3", "--debug"],
        ["--json", "profile", "validate", "--set", "parallel.tp=3"],
    ],
)
def test_global_options_go_before_or_after_the_subcommand(args, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    result = invoke(*args)
    assert result.exit_code == 2
    assert [json.loads(line)["event"] for line in result.stdout.splitlines()] == ["start", "error"]


def test_quiet_after_the_subcommand_prints_nothing_on_success(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    loud, quiet = invoke("profile", "validate"), invoke("profile", "validate", "-q")
    assert loud.exit_code == quiet.exit_code == 0
    assert loud.stdout.strip() and quiet.stdout == "" and quiet.stderr == ""


def test_options_after_a_double_dash_stay_where_they_are() -> None:
    assert hoist_global_flags(["clip", "a", "--json", "--", "--quiet"]) == [
        "--json",
        "clip",
        "a",
        "--",
        "--quiet",
    ]


def test_every_json_event_has_the_stable_keys(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    events = [json.loads(line) for line in invoke("profile", "list", "--json").stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and set(kinds[1:]) == {"progress"}
    assert all(e["command"] == "profile list" for e in events)
    progress = events[1:]
    assert [e["done"] for e in progress] == list(range(1, len(progress) + 1))
    assert all(e["unit"] == "profile" and e["total"] == len(progress) for e in progress)


def test_schema_is_json_schema_with_descriptions() -> None:
    schema = json.loads(invoke("profile", "schema").stdout)
    parallel = schema["$defs"]["Parallel"]["properties"]
    assert "Tensor-parallel degree" in parallel["tp"]["description"]


def test_version() -> None:
    assert invoke("--version").stdout.strip() == f"vidforge {__version__}"


def _boundary_app() -> typer.Typer:
    probe = typer.Typer(cls=GuardedGroup)

    @probe.callback()
    def root(ctx: typer.Context, json_: bool = typer.Option(False, "--json"), debug: bool = False) -> None:
        ctx.obj = Output(json=json_, debug=debug)
        set_current_output(ctx.obj)

    @probe.command()
    def crash() -> None:
        raise RuntimeError("disk on fire")

    @probe.command()
    def bad_input() -> None:
        raise UserInputError("--out: exists and is a file; pass a directory")

    return probe


def test_failure_while_running_exits_1_with_one_line() -> None:
    result = runner.invoke(_boundary_app(), ["crash"])
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: RuntimeError: disk on fire (rerun with --debug for the traceback)"
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback() -> None:
    result = runner.invoke(_boundary_app(), ["--debug", "crash"])
    assert result.exit_code == 1 and "Traceback" in result.stderr


def test_the_error_stays_one_line_while_torch_distributed_is_half_imported(monkeypatch) -> None:
    # A run that fails while a model loads on a background thread: torch.distributed is in sys.modules
    # but not yet filled in when the boundary checks for a process group to leave.
    monkeypatch.setitem(sys.modules, "torch.distributed", types.ModuleType("torch.distributed"))
    result = runner.invoke(_boundary_app(), ["bad-input"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --out: exists and is a file; pass a directory"


def test_user_error_from_library_code_exits_2_in_json() -> None:
    result = runner.invoke(_boundary_app(), ["--json", "bad-input"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["message"] == "--out: exists and is a file; pass a directory"


def test_the_command_line_starts_without_torch() -> None:
    """Every command's module loads torch only when it runs: `vidforge --help`, a refusal of bad input and
    each curation worker that re-imports the entry point start without torch's seconds of import."""
    import subprocess
    import sys

    code = "import sys, vidforge.cli.app; print(sorted(m for m in ('torch', 'diffusers') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
