"""README is the user's manual: what it tells a user to type works. Its set-up's test command is what CI
runs; every `vidforge` command line in its code blocks names a registered command and only options that
command takes; its links (and docs/'s) lead somewhere; it holds no test-file references or history (those
live in docs/developer.md and docs/benchmarks.md). docs/results.md dates every current number."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from vidforge.cli.app import app
from vidforge.cli.tokenize_cmd import DEFAULT, DefaultCommandGroup

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _code_lines(text: str) -> list[str]:
    """The lines of the bash/text code blocks, a `\\`-continued command joined into one line."""
    lines: list[str] = []
    for lang, body in _FENCE.findall(text):
        if lang not in ("bash", "text", ""):
            continue
        joined = ""
        for line in body.splitlines():
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            lines.append(joined + line)
            joined = ""
    return lines


def _commands(text: str) -> list[list[str]]:
    """Each `vidforge ...` invocation in the code blocks, as its words (comments dropped)."""
    found = []
    for line in _code_lines(text):
        line = re.sub(r"^\s*\$\s+", "", line)
        if not line.lstrip().startswith("vidforge "):
            continue
        words = shlex.split(line, comments=True)
        found.append(words[1:])
    return found


@functools.cache
def _root() -> Any:
    """The command tree as click sees it (typer's own click: a group is what has `commands`)."""
    return typer.main.get_command(app)


def _resolve(words: list[str]) -> tuple[Any, list[str], str]:
    """The command `words` runs, the words after its name, and its name as typed."""
    group: Any = _root()
    name = []
    rest = list(words)
    while hasattr(group, "commands"):
        head = next((w for w in rest if not w.startswith("-")), None)
        if head in group.commands:
            rest.remove(head)
            name.append(head)
            group = group.commands[head]
        elif isinstance(group, DefaultCommandGroup):  # `vidforge tokenize SRC -o OUT` is `tokenize encode`
            group = group.commands[DEFAULT]
        else:
            raise AssertionError(
                f"vidforge {' '.join(words)}: {head!r} is not a command of `{' '.join(name)}`"
            )
    return group, rest, " ".join(name)


def _options(command: Any) -> set[str]:
    return {o for p in command.params + _root().params for o in p.opts + p.secondary_opts}


def test_readme_test_command_is_what_ci_runs() -> None:
    """The set-up's two commands are Makefile targets, and .ci/run runs the README's test command."""
    text = README.read_text()
    setup = text[text.index("## Install and first run") :]
    block = _FENCE.search(setup)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(2).splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = [
        line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")
    ]
    assert ci[-1].strip() == "make test"


def test_readme_commands_are_registered_with_their_options() -> None:
    """Every `vidforge` line in README's code blocks: a real command, and only options it takes."""
    invocations = _commands(README.read_text())
    assert len(invocations) > 50  # the parser finds the manual's examples
    wrong = []
    for words in invocations:
        command, rest, name = _resolve(words)
        known = _options(command)
        for word in rest:
            option = word.split("=")[0]
            if option.startswith("-") and option != "-" and not option[1:].isdigit() and option not in known:
                wrong.append(f"vidforge {name}: {option}")
    assert wrong == []


def test_every_command_has_a_manual_entry() -> None:
    """Each top-level command is in README's command table."""
    table = README.read_text().split("## The commands", 1)[1].split("###", 1)[0]
    missing = [name for name in _root().commands if f"`{name}`" not in table]
    assert missing == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_links_lead_somewhere(page: Path) -> None:
    """Relative links name files that exist; `#anchor` links name a heading of their page."""
    text = page.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
            if anchor not in headings:
                broken.append(target)
    assert broken == []


def test_readme_is_a_manual_not_a_log() -> None:
    """No test files and no history in README: the test map is docs/developer.md, the log benchmarks.md."""
    text = README.read_text()
    found = re.findall(r"tests/\S+|\btest_\w+\.py|\bissue \d+|\bsession \d+|\bSince issue", text)
    assert found == []


def test_results_rows_are_dated() -> None:
    """docs/results.md: each measured row carries its date (YYYY-MM-DD) and a command or the suite."""
    text = (ROOT / "docs" / "results.md").read_text()
    rows = [
        r for r in text.splitlines() if r.startswith("| ") and not r.startswith("| what") and "---" not in r
    ]
    assert len(rows) > 30
    undated = [r[:60] for r in rows if not re.search(r"\| 20\d\d-\d\d-\d\d \|", r)]
    assert undated == []
