"""A pytest plugin of the GPU suite's correctness step (`pytest -p pytest_rows`, with bench/gpu on the
path): one JSON line per test, written to $VIDFORGE_GPU_SUITE_ROWS the moment the test finishes, so that
a device command stopped at its time limit keeps the outcome of every test that finished (a junit
report is written only at the end). The first line lists the collected tests, so the suite can say
which never ran. Under pytest-xdist the controller writes (it receives every worker's reports); the
workers write nothing."""

from __future__ import annotations

import json
import os

import pytest

_config: pytest.Config | None = None
_collected_written = False


def _write(record: dict) -> None:
    path = os.environ.get("VIDFORGE_GPU_SUITE_ROWS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


def _controller() -> bool:
    return _config is not None and not hasattr(_config, "workerinput")


def _collected(ids: list[str]) -> None:
    global _collected_written
    if not _collected_written:
        _collected_written = True
        _write({"collected": list(ids)})


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `slow` first (a stable sort, the same on every xdist worker): they then start at once
    on the workers, and the part's time budget, when it runs out, stops short tests rather than one long
    one that was queued last (the second H200 run lost `[fp8+compile]` that way)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if _controller() and session.items:  # under xdist the controller collects nothing itself
        _collected([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    # Collection under xdist happens on the workers (after -m's deselection); every worker sends the
    # same ids.
    _collected(ids)


def _message(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    text = report.longreprtext or ""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    lines = errors or [line for line in text.splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test's record: its call phase, or the setup phase where it skipped or failed there; a failing
    teardown adds an error record."""
    if not _controller():
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = report.outcome if report.when == "call" or report.skipped else "error"
        _write(
            {
                "test": report.nodeid,
                "outcome": outcome,
                "seconds": round(report.duration, 2),
                "message": _message(report) if not report.passed else "",
            }
        )
    elif report.when == "teardown" and report.failed:
        _write({"test": report.nodeid, "outcome": "error", "seconds": 0.0, "message": _message(report)})
