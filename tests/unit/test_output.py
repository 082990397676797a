"""What the console shows: a bar with an ETA on a terminal only, whole lines in a file or a pipe, no
Python warnings under --quiet/--json."""

from __future__ import annotations

import io
import os
import warnings

import pytest
from rich.console import Console

from vidforge.cli._output import Output


def _on_terminal(output: Output) -> io.StringIO:
    screen = io.StringIO()
    output.err_console = Console(file=screen, force_terminal=True, width=120)
    return screen


def test_train_bar_has_an_eta_on_a_terminal_only() -> None:
    human = Output()
    screen = _on_terminal(human)
    with human.step_bar("train", total=6) as on_step:
        for step in range(1, 5):
            on_step(step)
        human.err_console.print("a log line")  # goes above the bar
    assert "4/6" in screen.getvalue() and "ETA" in screen.getvalue() and "a log line" in screen.getvalue()

    for quiet in (Output(quiet=True), Output(json=True)):
        screen = _on_terminal(quiet)
        with quiet.step_bar("train", total=6) as on_step:
            on_step(1)
        assert screen.getvalue() == ""


def test_a_file_or_pipe_gets_whole_lines(capsys) -> None:
    output = Output()  # created under capsys: stdout and stderr are not terminals
    line = "step 1/6  loss 0.1234  " + "x" * 300 + "  MFU 1.1%"
    output.info(line)
    output.result({"notes": "y" * 300})
    captured = capsys.readouterr()
    assert captured.err == line + "\n"
    assert any("y" * 300 in row for row in captured.out.splitlines())


@pytest.mark.parametrize("flags", [{}, {"quiet": True}, {"json": True}])
def test_quiet_and_json_silence_python_warnings(flags, monkeypatch) -> None:
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Output(**flags)
        warnings.warn("TypedStorage is deprecated", UserWarning, stacklevel=1)
    assert len(seen) == (0 if flags else 1)
    # and in the processes started from here
    assert os.environ.get("PYTHONWARNINGS") == ("ignore" if flags else None)


def test_every_stage_notes_random_weights_the_same_way(capsys) -> None:
    output = Output()
    output.note_random_weights(["text_encoder"], "set text_encoder.path")
    output.note_random_weights([], "set text_encoder.path")  # trained weights: nothing to say
    Output(quiet=True).note_random_weights(["caption"], "x")
    assert capsys.readouterr().err == (
        "note: random weights in text_encoder: outputs carry no meaning (set text_encoder.path)\n"
    )


def test_a_results_notes_are_lines_under_its_table(capsys) -> None:
    output = Output()  # a file: tables as wide as their content
    notes = ["resumed from step 8", "train.steps 8 -> 12: the run keeps its schedule " + "x" * 150]
    output.result({"run_dir": "runs/a", "last_step": 12, "notes": notes, "none": []}, title="vidforge train")
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if "│" in line or "┃" in line]
    assert table and max(len(line) for line in table) < 40  # the notes are not a cell
    assert out.splitlines()[-3:] == ["notes:", *(f"  - {n}" for n in notes)]
    assert "none" not in out  # an empty list says nothing
