"""A headless Chromium the tests drive over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
messages ending in a NUL byte, the browser reading fd 3 and writing fd 4), with no client library and no
port. Chromium is Debian's `chromium` package; `chromium_or_skip` skips a test without it, except under
CI (CI=true), where a missing browser fails the test."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_or_skip() -> str:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    why = "no chromium on PATH (apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: CI must run the browser tests (.ci/run installs it)")
    pytest.skip(why)


def _as_fds_3_and_4(read_end: int, write_end: int) -> None:
    # Through fresh copies first: either end may itself be fd 3 or 4. A copy that lands on 3 or 4 makes
    # its dup2 a no-op that leaves the copy close-on-exec: mark both inheritable explicitly.
    read_copy, write_copy = os.dup(read_end), os.dup(write_end)
    os.dup2(read_copy, 3)
    os.dup2(write_copy, 4)
    os.set_inheritable(3, True)
    os.set_inheritable(4, True)


class Browser:
    """One headless browser with one page (tab)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900):
        self._profile = tempfile.mkdtemp(prefix="vidforge-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        self._proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",  # tests run as root in CI containers
                "--disable-gpu",
                "--no-first-run",
                "--mute-audio",
                "--hide-scrollbars",
                f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            # The browser reads commands on its fd 3 and writes replies on fd 4. close_fds=False keeps
            # the two dup2'ed (inheritable) fds; every other fd of ours is close-on-exec anyway.
            close_fds=False,
            preexec_fn=lambda: _as_fds_3_and_4(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    # -- the protocol ---------------------------------------------------------------------------------
    def _send(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _call(self, method: str, session: str | None = None, timeout: float = 30, **params: Any) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self._send(message)
        while True:
            reply = self._receive(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def call(self, method: str, **params: Any) -> dict:
        """A command to the page's session."""
        return self._call(method, session=self._session, **params)

    # -- what the tests do ----------------------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && document.body.dataset.rendered")

    def js(self, expression: str) -> Any:
        """Evaluate in the page; returns the value (JSON-serialisable), raising on a script error."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(f"!!({expression})")
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"never true: {expression}")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the middle of the element `selector` matches."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if box is None:
            raise LookupError(f"nothing matches {selector}")
        before = self.js("document.body.dataset.rendered")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)
        self.wait_for(f"document.body.dataset.rendered !== {json.dumps(before)}", timeout=5)

    def choose(self, selector: str, value: str) -> None:
        """Set a <select> or <input> to `value` as a user would (then it fires `change`)."""
        before = self.js("document.body.dataset.rendered")
        self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
            " e.dispatchEvent(new Event('change', {bubbles: true})); })()"
        )
        self.wait_for(f"document.body.dataset.rendered !== {json.dumps(before)}", timeout=5)

    def screenshot(self, path: Path, full_page: bool = True) -> bytes:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            w, h = self.js("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": min(h, 4000), "scale": 1}
        data = base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        try:
            self._call("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self._profile, ignore_errors=True)
