"""Caption enhancement (`curation.caption.enhance`) end to end: `vidforge caption` on sample clips with their
sidecar captions, each caption rewritten by a small OpenAI-compatible text server the test starts. The
server checks each request (model, the prompt filled with the caption, length and style, the key) and
answers a rewrite the test can compute; one caption it always refuses."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from curation_fixtures import CAPTION_BARE_SETS, make_clips_dir

from vidforge.curate import caption
from vidforge.data.manifest import read_jsonl
from vidforge.profile import load_profile
from vidforge.profile.caption import CaptionEnhance

SECRET = "sk-enhance-secret"
REFUSED = "quickly"  # a caption with this word gets HTTP 500 every time
PROMPT = CaptionEnhance().prompt


def rewrite(caption: str, words: int, style: str) -> str:
    return f"In {words} words, {style}: {caption[0].upper()}{caption[1:]}."


class FakeTextModel(BaseHTTPRequestHandler):
    seen: list[str] = []
    problems: list[str] = []
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        [message] = body["messages"]
        prompt = message["content"]
        problems = []
        if self.path != "/v1/chat/completions" or body["model"] != "text-model":
            problems.append(f"{self.path} {body['model']}")
        if self.headers.get("Authorization") != f"Bearer {SECRET}":
            problems.append("auth")
        found = re.fullmatch(r"(?s).*Caption: (.*)", prompt)
        caption_text = found.group(1) if found else ""
        if prompt != PROMPT.format(caption=caption_text, words=12, style="terse"):
            problems.append(f"prompt {prompt!r}")
        with self.lock:
            self.seen.append(caption_text)
            self.problems.extend(problems)
        if REFUSED in caption_text:
            status, answer = 500, {"error": "overloaded"}
        else:
            text = rewrite(caption_text, 12, "terse")
            status, answer = 200, {"choices": [{"message": {"role": "assistant", "content": f" {text}\n"}}]}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def text_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeTextModel)
    FakeTextModel.seen, FakeTextModel.problems = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_enhancement_rewrites_each_caption_and_keeps_the_original(
    tmp_path, sample_videos, sample_truth, text_server, monkeypatch
):
    monkeypatch.setenv("VIDFORGE_ENHANCE_KEY", SECRET)
    clips = make_clips_dir(tmp_path / "clips", sample_videos, sample_truth)
    sets = [
        *CAPTION_BARE_SETS,
        "curation.caption.enhance.enabled=true",
        f"curation.caption.enhance.url={text_server}",
        "curation.caption.enhance.model=text-model",
        "curation.caption.enhance.api_key_env=VIDFORGE_ENHANCE_KEY",
        "curation.caption.enhance.words=12",
        "curation.caption.enhance.style=terse",
        "curation.caption.enhance.retries=0",
    ]
    out = tmp_path / "out"
    caption.run(load_profile(None, sets), clips, out)
    decoded = [r for r in read_jsonl(out / "manifest.jsonl") if "error:decode" not in r["reasons"]]
    rows = {r["source"].rsplit("/", 1)[-1]: r for r in decoded}
    assert FakeTextModel.problems == []

    red = rows["red_square.mp4"]  # its sidecar caption, rewritten; the first one kept beside it
    assert red["caption_original"] == "a red square moving right"
    assert red["caption"] == rewrite("a red square moving right", 12, "terse")
    assert red["caption_enhanced_by"] == "enhance:text-model" and red["keep"]
    enhanced = [r for r in rows.values() if r["caption_enhanced_by"]]
    assert all(r["caption"] == rewrite(r["caption_original"], 12, "terse") for r in enhanced)
    # Only clean captions are sent (an empty or degenerate one has nothing to keep facts of), once each.
    sent = sorted(
        r["caption_original"] for r in rows.values() if r["caption_original"] and not r["caption_flags"]
    )
    assert sorted(FakeTextModel.seen) == sent and len(enhanced) == len(sent) - 1

    fast = rows["motion_fast.mp4"]  # refused: rejected, not kept with a caption of another style
    assert fast["caption"] == fast["caption_original"] == "a red square moving right quickly"
    assert not fast["keep"] and "error:enhance" in fast["reasons"] and fast["caption_enhanced_by"] is None
    [err] = [e for e in read_jsonl(out / "errors.jsonl") if e.get("step") == "enhance"]
    assert err["clip_id"] == fast["clip_id"] and "HTTP 500" in err["reason"] and SECRET not in err["reason"]


def test_enhancement_prompt_without_the_caption_is_refused():
    with pytest.raises(Exception, match=r"prompt must contain \{caption\}"):
        load_profile(None, ["curation.caption.enhance.prompt=Rewrite it."])


def test_enhancement_url_is_checked_before_any_model_loads(tmp_path, sample_videos, sample_truth):
    from vidforge.curate.captioning.checks import check_inputs
    from vidforge.errors import UserInputError

    cfg = load_profile(
        None,
        [
            "curation.caption.backend=sidecar",
            "curation.caption.enhance.enabled=true",
            "curation.caption.enhance.url=http://127.0.0.1:9/v1/chat/completions",
        ],
    ).curation.caption
    with pytest.raises(UserInputError, match=r"curation.caption.enhance.url: give the base URL"):
        check_inputs(cfg, [])
