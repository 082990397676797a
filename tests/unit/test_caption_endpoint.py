"""The endpoint captioner against a small OpenAI-compatible server started by the test, which checks each
request (frames present as images, the prompt, the model name) and can delay or fail on purpose."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2
import numpy as np
import pytest

from vidforge.curate.captioning.captioners import ClipItem
from vidforge.curate.captioning.captioners.endpoint import EndpointCaptioner
from vidforge.profile.caption import VCHITECT_PROMPT
from vidforge.profile.caption import EndpointCaptioner as EndpointSettings

SECRET = "sk-test-secret-123"


class FakeVLM:
    """Answers chat completions with a caption naming the clip's mean colour; behaviours per clip marker."""

    def __init__(self, expect_frames: int, model: str):
        self.expect_frames, self.model = expect_frames, model
        self.requests: list[dict] = []
        self.problems: list[str] = []
        self.failed_once: set[str] = set()
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0

    def answer(self, body: dict, auth: str | None) -> tuple[int, dict, float]:
        content = body["messages"][0]["content"]
        images = [p for p in content if p["type"] == "image_url"]
        texts = [p["text"] for p in content if p["type"] == "text"]
        if body.get("model") != self.model:
            self.problems.append(f"model {body.get('model')!r}")
        if texts != [VCHITECT_PROMPT]:
            self.problems.append(f"prompt {texts!r}")
        if auth != f"Bearer {SECRET}":
            self.problems.append(f"auth {auth!r}")
        if len(images) != self.expect_frames:
            self.problems.append(f"{len(images)} images")
        decoded = []
        for part in images:
            url = part["image_url"]["url"]
            head, data = url.split(",", 1)
            if head != "data:image/jpeg;base64":
                self.problems.append(f"image header {head!r}")
            img = cv2.imdecode(np.frombuffer(base64.b64decode(data), np.uint8), cv2.IMREAD_COLOR)
            if img is None:
                self.problems.append("image does not decode")
            else:
                decoded.append(img[..., ::-1])
        level = int(round(float(np.mean([d.mean() for d in decoded])))) if decoded else -1
        with self.lock:
            self.requests.append({"level": level, "images": len(images)})
        if level == 200 and "slow" not in self.failed_once:  # first request for this clip hangs
            self.failed_once.add("slow")
            return 200, _answer("too late"), 2.0
        if level == 150 and "flaky" not in self.failed_once:  # first request for this clip fails
            self.failed_once.add("flaky")
            return 500, {"error": "overloaded"}, 0.0
        if level == 100:  # this clip always fails
            return 500, {"error": "broken"}, 0.0
        return 200, _answer(f"A clip whose mean level is {level}."), 0.05


def _answer(text: str) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
    }


@pytest.fixture
def server():
    vlm = FakeVLM(expect_frames=5, model="test-vlm")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with vlm.lock:
                vlm.in_flight += 1
                vlm.max_in_flight = max(vlm.max_in_flight, vlm.in_flight)
            try:
                status, payload, delay = vlm.answer(body, self.headers.get("Authorization"))
                time.sleep(delay)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                with vlm.lock:
                    vlm.in_flight -= 1

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield vlm, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _clip(level: int, n: int = 20) -> ClipItem:
    frames = {i: np.full((64, 80, 3), level, np.uint8) for i in range(n)}
    return ClipItem(clip_id=f"c{level}", record={}, num_frames=n, frames=frames)


def test_endpoint_sends_frames_prompt_model_and_retries(server, monkeypatch, caplog):
    vlm, url = server
    monkeypatch.setenv("VIDFORGE_TEST_VLM_KEY", SECRET)
    settings = EndpointSettings(
        url=url,
        model="test-vlm",
        api_key_env="VIDFORGE_TEST_VLM_KEY",
        frames=5,
        concurrency=2,
        timeout_s=0.5,
        retries=2,
        backoff_s=0.01,
    )
    sleeps: list[float] = []
    captioner = EndpointCaptioner(settings, sleep=lambda s: sleeps.append(s) or time.sleep(s))
    caplog.set_level("DEBUG")
    captioner.setup()
    items = [_clip(40), _clip(200), _clip(150), _clip(100), _clip(80)]
    results = captioner.caption(items)
    captioner.close()

    assert vlm.problems == []
    assert [r.text for r in results] == [
        "A clip whose mean level is 40.",
        "A clip whose mean level is 200.",  # timed out once, then retried
        "A clip whose mean level is 150.",  # HTTP 500 once, then retried
        None,  # fails every time: an error for this clip, the batch goes on
        "A clip whose mean level is 80.",
    ]
    assert (
        results[3].error is not None and "HTTP 500" in results[3].error and "3 attempts" in results[3].error
    )
    assert all(r.error is None for i, r in enumerate(results) if i != 3)
    assert all(r.source == "endpoint:test-vlm" for r in results)
    counts = {level: sum(r["level"] == level for r in vlm.requests) for level in (40, 200, 150, 100, 80)}
    assert counts == {40: 1, 200: 2, 150: 2, 100: 3, 80: 1}
    assert vlm.max_in_flight <= 2
    assert sleeps.count(0.01) == 3 and sleeps.count(0.02) == 1  # backoff doubles: 1 + 1 + (1, 2)
    assert SECRET not in caplog.text and all(SECRET not in (r.error or "") for r in results)


def test_endpoint_without_key_sends_no_authorization(server):
    vlm, url = server
    settings = EndpointSettings(
        url=url, model="test-vlm", api_key_env="VIDFORGE_UNSET_VARIABLE_X", frames=5, retries=0
    )
    captioner = EndpointCaptioner(settings)
    captioner.setup()
    [result] = captioner.caption([_clip(60)])
    assert result.text == "A clip whose mean level is 60."
    assert vlm.problems == ["auth None"]
