"""The endpoint captioner against hostile servers (issue 23, point 5), all on 127.0.0.1: the API's server
redirects to another origin (another port), which must never see the Bearer key; that server's reply is
not a caption; an error body that echoes the request's headers must not put the key in what is recorded."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from vidforge.curate.captioning.captioners import ClipItem
from vidforge.curate.captioning.captioners.endpoint import EndpointCaptioner
from vidforge.errors import UserInputError
from vidforge.profile.caption import EndpointCaptioner as EndpointSettings

SECRET = "sk-hostile-test-456"


def _serve(respond):
    """A server on 127.0.0.1 whose POST answers are `respond(handler) -> (status, headers, body)`; it
    records each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(dict(self.headers))
            status, headers, body = respond(self)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}", seen


@pytest.fixture
def servers():
    started = []

    def start(respond):
        s = _serve(respond)
        started.append(s[0])
        return s

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


def _caption(url: str, monkeypatch) -> list:
    monkeypatch.setenv("VIDFORGE_HOSTILE_KEY", SECRET)
    settings = EndpointSettings(
        url=url, model="m", api_key_env="VIDFORGE_HOSTILE_KEY", frames=2, retries=1, backoff_s=0
    )
    captioner = EndpointCaptioner(settings, sleep=lambda s: None)
    captioner.setup()
    frames = {i: np.full((16, 16, 3), 90, np.uint8) for i in range(4)}
    return captioner.caption([ClipItem(clip_id="c", record={}, num_frames=4, frames=frames)])


def _chat(text):
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


@pytest.mark.parametrize("code", [301, 302, 307, 308])
def test_a_redirect_to_another_origin_never_receives_the_key(servers, monkeypatch, code):
    _, other, other_seen = servers(lambda h: (200, {"Content-Type": "application/json"}, b'{"ok": true}'))
    _, api, api_seen = servers(lambda h: (code, {"Location": f"{other}/v1/chat/completions"}, b""))
    [result] = _caption(f"{api}/v1", monkeypatch)
    assert api_seen and api_seen[0]["Authorization"] == f"Bearer {SECRET}"
    assert other_seen == []  # not followed at all, so no header of ours reached the other origin
    assert result.text is None
    assert result.error.startswith(f"EndpointError: HTTP {code}: redirected to {other}/v1/chat/completions")


@pytest.mark.parametrize(
    "reply",
    [
        b'{"ok": true}',
        b"<html>welcome</html>",
        json.dumps({"choices": [{"message": {"role": "assistant"}}]}).encode(),
        json.dumps({"choices": [{"message": {"content": {"evil": 1}}}]}).encode(),
    ],
)
def test_a_reply_that_is_not_a_chat_completion_is_the_clips_error(servers, monkeypatch, reply):
    _, api, _ = servers(lambda h: (200, {"Content-Type": "application/json"}, reply))
    [result] = _caption(f"{api}/v1", monkeypatch)
    assert result.text is None and result.error.startswith("EndpointError: not a chat-completions answer")


def test_a_real_answer_still_captions(servers, monkeypatch):
    _, api, _ = servers(lambda h: (200, {"Content-Type": "application/json"}, _chat("a grey square")))
    [result] = _caption(f"{api}/v1", monkeypatch)
    assert result.text == "a grey square" and result.error is None


@pytest.mark.parametrize("status", [400, 503])
@pytest.mark.parametrize("padding", [0, 175])  # 175: the recorded 200 characters would end inside the key
def test_an_error_body_echoing_the_headers_has_the_key_cut_out(servers, monkeypatch, status, padding):
    def echo(handler):
        return status, {}, ("x" * padding + f" you sent {handler.headers['Authorization']}").encode()

    _, api, seen = servers(echo)
    [result] = _caption(f"{api}/v1", monkeypatch)
    assert seen[0]["Authorization"] == f"Bearer {SECRET}"  # the server did get (and echo) the key
    assert result.text is None and SECRET[:4] not in result.error
    if status == 400:  # 503 is retried, and the error says so rather than quoting the body
        assert "you sent Bearer [redac" in result.error


def _trickle(handler, what: bytes, every_s: float):
    """Writes `what` one byte every `every_s` seconds, stopping when the client hangs up."""
    for byte in what:
        try:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
        except OSError:
            return
        time.sleep(every_s)


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_server_trickling_bytes_is_cut_off_at_the_request_deadline(servers, monkeypatch, where):
    """Issue 38, point 1: a byte every 0.2 s never trips a 0.5 s read timeout, so the request ran as long as
    the server liked (the report's ran past 100 s holding the folder's lock). The deadline bounds it."""
    body = _chat("x" * 40)
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()

    def slow(handler):
        handler.rfile.read(int(handler.headers.get("Content-Length", 0)))
        if where == "headers":
            _trickle(handler, head + body, 0.2)
        else:
            handler.wfile.write(head)
            _trickle(handler, body, 0.2)

    class Handler(BaseHTTPRequestHandler):
        do_POST = slow  # noqa: N815

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        monkeypatch.setenv("VIDFORGE_HOSTILE_KEY", SECRET)
        settings = EndpointSettings(
            url=f"http://127.0.0.1:{httpd.server_address[1]}/v1",
            model="m",
            api_key_env="VIDFORGE_HOSTILE_KEY",
            frames=2,
            retries=1,
            backoff_s=0,
            timeout_s=0.5,
        )
        captioner = EndpointCaptioner(settings, sleep=lambda s: None)
        captioner.setup()
        frames = {i: np.full((16, 16, 3), 90, np.uint8) for i in range(4)}
        start = time.monotonic()
        [result] = captioner.caption([ClipItem(clip_id="c", record={}, num_frames=4, frames=frames)])
        took = time.monotonic() - start
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.text is None
    assert result.error == "EndpointError: timed out after 0.5 s (2 attempts)"
    assert took < 2.0  # two attempts of 0.5 s each; the whole answer takes the server 20 s or more


@pytest.mark.parametrize("name", ["HOME", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "VIDFORGE_API_KEY_ENVS"])
def test_a_profile_may_name_only_vidforge_key_variables(monkeypatch, name):
    """Issue 38, point 7: `api_key_env` could name any variable, so a shared profile could send HOME or a
    cloud token to its own URL. Only VIDFORGE_* names, or ones the user lists in VIDFORGE_API_KEY_ENVS."""
    monkeypatch.setenv(name, "a-secret-value")
    monkeypatch.delenv("VIDFORGE_API_KEY_ENVS", raising=False)
    settings = EndpointSettings(url="http://127.0.0.1:9/v1", model="m", api_key_env=name)
    with pytest.raises(UserInputError) as err:
        EndpointCaptioner(settings).setup()
    assert str(err.value).startswith(
        f"curation.caption.endpoint.api_key_env: {name} is not a VIDFORGE_* variable, and a profile sends "
        "only keys named for vidforge; "
    )
    if name != "VIDFORGE_API_KEY_ENVS":
        monkeypatch.setenv("VIDFORGE_API_KEY_ENVS", f"SOMETHING_ELSE, {name}")  # the user's own choice
        EndpointCaptioner(settings).setup()


SPECIAL = "sk-ho/st+ile=test 456"  # characters that percent-encoding and base64 both change


@pytest.mark.parametrize(
    "encode",
    [
        lambda k: base64.b64encode(k.encode()).decode(),
        lambda k: base64.b64encode(f"Bearer {k}".encode()).decode(),  # another alignment
        lambda k: base64.b64encode(f"auth={k};".encode()).decode(),  # and the third
        lambda k: base64.urlsafe_b64encode(f"x{k}".encode()).decode(),
        lambda k: urllib.parse.quote(k, safe=""),
        lambda k: urllib.parse.quote_plus(k),
        lambda k: k.encode().hex(),
    ],
    ids=["base64", "base64-bearer", "base64-shifted", "urlsafe", "percent", "plus", "hex"],
)
def test_the_key_is_cut_out_of_error_bodies_in_its_encoded_forms_too(servers, monkeypatch, encode):
    """Only the literal key was cut: an endpoint that returned it base64-encoded wrote it into errors.jsonl."""
    _, api, _ = servers(lambda h: (400, {}, f"you sent {encode(SPECIAL)} !".encode()))
    monkeypatch.setenv("VIDFORGE_HOSTILE_KEY", SPECIAL)
    settings = EndpointSettings(url=f"{api}/v1", model="m", api_key_env="VIDFORGE_HOSTILE_KEY", retries=0)
    captioner = EndpointCaptioner(settings, sleep=lambda s: None)
    captioner.setup()
    frames = {i: np.full((16, 16, 3), 90, np.uint8) for i in range(4)}
    [result] = captioner.caption([ClipItem(clip_id="c", record={}, num_frames=4, frames=frames)])
    assert result.error.startswith("EndpointError: HTTP 400: you sent ") and result.error.endswith(" !")
    shown = result.error.removeprefix("EndpointError: HTTP 400: you sent ").removesuffix(" !")
    assert "[redacted]" in shown
    # What is left of the encoded text is the prefix's encoding and at most 3 characters (4 bytes' worth
    # of bits at either end) that mix the key's bits with their neighbours'.
    left, encoded = shown.replace("[redacted]", ""), encode(SPECIAL)
    key_chars = len(encoded) - len(encode(""))
    assert len(encoded) - len(left) >= key_chars - 3, shown
