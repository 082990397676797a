"""Output for humans (rich), for machines (`--json`: one JSON object per line on stdout) and `--quiet`.

Exit codes (also in the README): 0 success, 1 failure while running, 2 a user error (fix the input),
3 partial success (the batch finished but some inputs were rejected or failed; see the errors file).

Under `--json` every command writes the same four kinds of event, each with `event` and `command` (e.g.
"train", "bench train"):
- `start`: once, before the work (`version`).
- `progress`: `unit` (what is counted: step, shard, source, clip, point, profile), `done`, `total` (null
  when unknown), and the unit's own fields.
- `result`: once, the command's outcome (its own fields).
- `error`: `kind` (user, failure, interrupted) and `message`; the exit code says the rest."""

from __future__ import annotations

import itertools
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from vidforge.cli._terminal import printable

EXIT_OK, EXIT_FAILURE, EXIT_USER_ERROR, EXIT_PARTIAL = 0, 1, 2, 3
EXIT_TERMINATED = 143  # 128 + SIGTERM: stopped on request, resumable


@dataclass
class Output:
    json: bool = False
    quiet: bool = False
    debug: bool = False
    command: str = ""

    def __post_init__(self) -> None:
        self.console = _console(stderr=False)
        self.err_console = _console(stderr=True)
        if self.json or self.quiet:
            silence_warnings()

    @property
    def show_progress(self) -> bool:
        """Progress bars go to stderr for humans only; JSON and quiet runs stay clean for cron logs."""
        return not (self.json or self.quiet)

    @property
    def live(self) -> bool:
        """Bars and spinners redraw in place: only for a human at a terminal (a log file gets lines)."""
        return self.show_progress and self.err_console.is_terminal

    @contextmanager
    def step_bar(self, label: str, total: int) -> Iterator[Callable[[int], None]]:
        """A callback `(steps done)` that moves a bar with an ETA on a terminal; nothing elsewhere (plain
        log lines and --json progress events say the same there). The first call places the bar (a resumed
        run starts part way) without counting toward the speed the ETA comes from."""
        if not self.live:
            yield lambda step: None
            return
        with _progress_bar(self.err_console, label, transient=True) as bar:
            task = bar.add_task(label, total=total)
            placed = False

            def advance(step: int) -> None:
                nonlocal placed
                if not placed:
                    bar.reset(task, total=total, completed=step - 1)
                    placed = True
                bar.update(task, completed=step)

            yield advance

    @contextmanager
    def working(self, message: str) -> Iterator[None]:
        """Long work with no count to show: a spinner on a terminal, else the message once."""
        if not self.live:
            self.info(message)
            yield
            return
        with self.err_console.status(message):
            yield

    def info(self, message: str) -> None:
        """A line for a human reading along; dropped in --json and --quiet modes."""
        if not (self.json or self.quiet):
            self.err_console.print(message)

    def event(self, event: str, /, **fields: Any) -> None:
        """A machine-readable line in --json mode; nothing otherwise. Kinds: see the module docstring."""
        if self.json:
            self._json_line({"event": event, "command": self.command, **fields})

    def start(self) -> None:
        from vidforge import __version__

        self.event("start", version=__version__)

    def note_random_weights(self, models: Sequence[str], fix: str) -> None:
        """The one way every stage says it ran models without trained weights (fine for a demo or a test:
        their outputs carry no meaning). `fix` says how to give real weights."""
        if models:
            self.info(
                f"[yellow]note:[/] random weights in {', '.join(models)}: outputs carry no meaning ({fix})"
            )

    def progress(self, unit: str, done: int, total: int | None, **fields: Any) -> None:
        """One unit of work finished (a `progress` event in --json mode; bars show it for humans)."""
        self.event("progress", unit=unit, done=done, total=total, **fields)

    def result(self, data: Mapping[str, Any], *, title: str | None = None, text: str | None = None) -> None:
        """The command's outcome: a JSON line, or `text` (or a key/value table) for humans."""
        if self.json:
            self.event("result", **data)
        elif not self.quiet:
            if text is not None:
                self.console.print(text, markup=False, highlight=False, soft_wrap=True)
                return
            # A list of sentences (a run's notes) goes under the table, a line each: in a cell it made
            # the table as wide as its longest sentence in a log file.
            lines = {
                k: v
                for k, v in data.items()
                if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)
            }
            self.table(
                [(k, _fmt(v)) for k, v in data.items() if k not in lines], columns=("", ""), title=title
            )
            for key, items in lines.items():
                if items:
                    self.console.print(
                        "\n".join([f"{key}:", *(f"  - {item}" for item in items)]),
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )

    @contextmanager
    def shard_progress(self, label: str, bar: bool = True) -> Iterator[Callable[[dict[str, Any], int], None]]:
        """A callback `(shard entry, total shards)` for stages that work shard by shard: it advances a
        transient progress bar for humans (`bar`: False when `sample_progress` shows the stage), and emits
        one `progress` event (unit `shard`) per shard in --json mode."""
        if not self.show_progress or not bar:
            done = itertools.count(1)
            yield lambda entry, total: self.progress("shard", next(done), total, **entry)
            return
        with _progress_bar(self.err_console, label, transient=True) as bar:
            task = bar.add_task(label, total=None)
            yield lambda entry, total: bar.update(task, advance=1, total=total)

    @contextmanager
    def sample_progress(self, label: str) -> Iterator[Callable[[int, int], None]]:
        """A callback `(done, total)` over a stage's samples, for a stage whose shards take minutes each: a
        bar with its total on a terminal, a line at each tenth for a human's log file, nothing under --json
        and --quiet (their shard events say it)."""
        if not self.show_progress:
            yield lambda done, total: None
            return
        if not self.live:
            said = [-1]

            def line(done: int, total: int) -> None:
                tenth = done * 10 // max(total, 1)
                if tenth > said[0]:
                    said[0] = tenth
                    self.info(f"{label}: {done}/{total} samples")

            yield line
            return
        with _progress_bar(self.err_console, label, transient=True) as progress:
            task = progress.add_task(label, total=None)
            yield lambda done, total: progress.update(task, completed=done, total=total)

    def table(self, rows: Sequence[Sequence[Any]], columns: Sequence[str], title: str | None = None) -> None:
        """Every cell and the title as text (`printable`): a table shows data (clip ids, reasons, paths),
        which must neither drive the terminal (ESC, BEL) nor be read by rich as markup."""
        if self.json or self.quiet:
            return
        table = Table(title=None if title is None else printable(title), show_header=any(columns))
        for col in columns:
            table.add_column(printable(col))
        for row in rows:
            table.add_row(*(printable(_fmt(v)) for v in row))
        self.console.print(table)

    def error(self, message: str, *, kind: str) -> None:
        """One line: JSON on stdout in --json mode (so a cron wrapper parses it), else on stderr."""
        if self.json:
            self.event("error", kind=kind, message=message)
        else:
            self.err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)

    @staticmethod
    def _json_line(obj: Mapping[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj, default=str) + "\n")
        sys.stdout.flush()


def _progress_bar(console: Console, label: str, *, transient: bool) -> Any:
    """Every bar looks the same: label, bar, done/total, elapsed, ETA (rich imported only when shown)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    return Progress(*columns, console=console, transient=transient)


def _console(*, stderr: bool) -> Console:
    """A terminal gets rich's wrapping at its width; a file or a pipe gets whole lines (a log reader or a
    parser must not find `MFU \\n1.1%`), and tables as wide as their content."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console.soft_wrap = True
        console.width = 100_000
    return console


def silence_warnings() -> None:
    """--quiet and --json: Python warnings (torch's UserWarnings) stay off the terminal, here and in the
    processes this one starts (PYTHONWARNINGS is inherited; workers that parse --quiet do it themselves)."""
    warnings.simplefilter("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


def silence_library_bars() -> None:
    """The libraries' own progress bars (transformers' "Loading weights", huggingface_hub's, diffusers')
    stay off: each stage shows its own progress, one owner for what a user watches. Set before those
    libraries import, where it counts (HF_HUB_DISABLE_PROGRESS_BARS=0 from the user brings them back)."""
    if os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1") != "1":
        return
    for module, off in (
        ("huggingface_hub.utils", "disable_progress_bars"),
        ("transformers.utils.logging", "disable_progress_bar"),
        ("diffusers.utils.logging", "disable_progress_bar"),
    ):
        loaded = sys.modules.get(module)  # already imported: its switch, since the variable is read at import
        if loaded is not None:
            getattr(loaded, off)()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_CURRENT: ContextVar[Output | None] = ContextVar("vidforge_output", default=None)


def set_current_output(output: Output) -> None:
    """Called by the root callback, once per invocation, before any subcommand runs."""
    _CURRENT.set(output)


def current_output() -> Output:
    """The Output of this invocation (a plain human one outside a CLI run)."""
    return _CURRENT.get() or Output()


class StageBars:
    """One rich progress bar per executor stage on stderr, driven by the executor's stage statistics.
    A stage with a known total keeps it; the others grow with the items that have reached them."""

    def __init__(self, output: Output):
        self.progress = _progress_bar(output.err_console, "{task.description:>10}", transient=False)
        self.tasks: dict[str, int] = {}
        self.fixed: dict[str, int | None] = {}

    def start(self, totals: dict[str, int | None]) -> None:
        for name, total in totals.items():
            self.tasks[name] = self.progress.add_task(name, total=total)
            self.fixed[name] = total
        self.progress.start()

    def update(self, stats: Sequence[Any]) -> None:
        for s in stats:
            task = self.tasks.get(s.name)
            if task is not None:
                total = self.fixed[s.name] if self.fixed[s.name] is not None else s.items_in
                self.progress.update(task, completed=s.items_done, total=total)

    def stop(self) -> None:
        if self.tasks:
            self.progress.stop()
