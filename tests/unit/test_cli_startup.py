"""What `vidforge clip` imports before its first frame: never torch (unless a model is asked for) nor a
second copy of click, and the collector pause around the imports leaves collection on for the run."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import gc, json, sys
from vidforge.cli import app, clip_cmd  # the command line, as `vidforge clip` loads it
with clip_cmd.collector_paused():
    from vidforge.curate.clip import run  # what the command imports before the first frame
print(json.dumps({"modules": sorted(sys.modules), "collecting": gc.isenabled()}))
"""


def test_the_clip_path_imports_no_torch_and_collects_after_start_up() -> None:
    probe = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True)
    found = json.loads(probe.stdout)
    heavy = {"torch", "transformers", "diffusers", "open_clip", "click"} & {
        name.split(".")[0] for name in found["modules"]
    }
    assert heavy == set()
    assert (
        "scenedetect" in found["modules"] and "vidforge.profile" in found["modules"]
    )  # the probe ran the path
    assert found["collecting"]


def test_collector_paused_restores_what_it_found() -> None:
    import gc

    from vidforge.cli._startup import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not switch it on under the outer one
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
