"""One HTTP client for OpenAI-compatible chat-completions servers (vLLM, SGLang and the like), shared by
the endpoint captioner and caption enhancement.

Each request has a deadline (`timeout_s` bounds the whole attempt: connecting, sending, the answer's
headers and body, not each socket read, so a server that trickles a byte a second cannot hold a clip, or the
output folder's lock, for longer) and retries with exponential backoff on timeouts, connection errors, 429
and 5xx. The API key is read from an environment variable at setup and sent as a Bearer header to the
configured origin only: a redirect is not followed (urllib would resend the header to wherever it points)
but is that request's error, as is an answer that is not a chat completion. The key is never logged,
stored in results or put in error messages: a server that echoes request headers in an error body has the
key cut out of what is recorded."""

from __future__ import annotations

import base64
import functools
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

from vidforge.errors import UserInputError

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class EndpointError(RuntimeError):
    """A request that failed for good (after retries, or with an answer that retrying cannot fix)."""


class ChatClient:
    """Posts chat-completions bodies to `settings.url` (a profile.caption.ChatEndpoint); `field` names the
    profile section in user errors. Thread-safe once set up (one request per call, no shared state)."""

    def __init__(self, settings: Any, field: str, sleep=time.sleep):
        self.settings, self.field = settings, field
        self._sleep = sleep
        self._headers: dict[str, str] | None = None
        self._secrets: list[str] = []
        self.url = settings.url.rstrip("/") + "/chat/completions"

    def setup(self) -> None:
        if not self.settings.url.startswith(("http://", "https://")):
            raise UserInputError(
                f"{self.field}.url must start with http:// or https://, got {self.settings.url!r}"
            )
        headers = {"Content-Type": "application/json"}
        env = self.settings.api_key_env
        if env:
            check_key_variable(env, f"{self.field}.api_key_env")
        key = os.environ.get(env, "") if env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._headers = headers
        self._secrets = encoded_forms(key) if key else []
        log.info(
            "%s: %s model %s (API key %s)",
            self.field,
            self.url,
            self.settings.model,
            f"from ${env}" if key else "not set",
        )

    @property
    def ready(self) -> bool:
        return self._headers is not None

    def close(self) -> None:
        self._headers = None

    def _redact(self, text: str) -> str:
        for form in self._secrets:
            text = text.replace(form, "[redacted]")
        return text

    def _post(self, data: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url, data=data, headers=self._headers or {}, method="POST")
        deadline = _Deadline(self.settings.timeout_s)
        try:
            try:
                with _opener(deadline).open(req, timeout=self.settings.timeout_s) as response:
                    status, payload = response.status, response.read()
            except urllib.error.HTTPError as err:
                if 300 <= err.code < 400:
                    where = err.headers.get("Location", "?")
                    raise EndpointError(
                        f"HTTP {err.code}: redirected to {where}, not followed (the API key goes to "
                        f"{self.field}.url only; set it to the final address)"
                    ) from None
                status, payload = err.code, err.read()
        except (OSError, http.client.HTTPException):
            if deadline.expired:
                raise TimeoutError from None
            raise
        finally:
            deadline.cancel()
        if deadline.expired:  # cut while reading a body without a length: what was read is short
            raise TimeoutError
        return status, payload

    def answers(
        self, items: list[T], body: Callable[[T], dict[str, Any]]
    ) -> list[tuple[str | None, str | None]]:
        """(text, None) or (None, why) for each item's request `body(item)`, in order, `concurrency` at a
        time (bodies are built on the pool's threads too: JPEG encoding runs in parallel). One item's
        failure is its own and never stops the others."""
        if not self.ready:
            self.setup()

        def one(item: T) -> tuple[str | None, str | None]:
            try:
                return self.request(body(item)), None
            except Exception as err:  # noqa: BLE001 - this item's error
                return None, f"{type(err).__name__}: {err}"

        with ThreadPoolExecutor(max_workers=min(self.settings.concurrency, max(1, len(items)))) as pool:
            return list(pool.map(one, items))

    def request(self, body: dict[str, Any]) -> str:
        """POST one request, retrying what can be retried; returns the answer's text."""
        if self._headers is None:
            raise RuntimeError("call setup() first")
        try:
            return self._request(body)
        except EndpointError as err:
            raise EndpointError(self._redact(str(err))) from None

    def _request(self, body: dict[str, Any]) -> str:
        data = json.dumps(body).encode("utf-8")
        attempts = self.settings.retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                self._sleep(self.settings.backoff_s * 2 ** (attempt - 1))
            try:
                status, payload = self._post(data)
            except TimeoutError:
                last = f"timed out after {self.settings.timeout_s:g} s"
                continue
            except (OSError, http.client.HTTPException) as err:
                reason = getattr(err, "reason", err)
                if isinstance(reason, (TimeoutError, socket.timeout)):
                    last = f"timed out after {self.settings.timeout_s:g} s"
                else:
                    last = f"connection failed ({type(reason).__name__})"
                continue
            text = self._redact(payload.decode("utf-8", "replace"))  # before any cut: no half key either
            if status in RETRYABLE_STATUS:
                last = f"HTTP {status}"
                continue
            if status != 200:
                raise EndpointError(f"HTTP {status}: {text[:200]}")
            try:
                return _message_text(json.loads(text)["choices"][0]["message"])
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                raise EndpointError(f"not a chat-completions answer: {text[:200]}") from None
        raise EndpointError(f"{last} ({attempts} attempt{'s' if attempts > 1 else ''})")


# Besides these names, a profile may send only variables named for vidforge: a profile is shared, and one
# naming HOME, AWS_SECRET_ACCESS_KEY or OPENAI_API_KEY beside its own URL would send that secret there.
KEY_PREFIX = "VIDFORGE_"
ALLOW_ENV = "VIDFORGE_API_KEY_ENVS"


def check_key_variable(name: str, field: str) -> None:
    """UserInputError unless the environment variable `name` may be sent as an API key: it starts with
    VIDFORGE_, or the user listed it (comma-separated) in $VIDFORGE_API_KEY_ENVS, which no profile sets."""
    allowed = {n.strip() for n in os.environ.get(ALLOW_ENV, "").split(",") if n.strip()}
    if name in allowed or (name.startswith(KEY_PREFIX) and name != ALLOW_ENV):
        return
    raise UserInputError(
        f"{field}: {name} is not a {KEY_PREFIX}* variable, and a profile sends only keys named for vidforge; "
        f"put the key in one (VIDFORGE_CAPTION_API_KEY by default) and name that, or add {name} to "
        f"${ALLOW_ENV} if it is meant for this endpoint"
    )


def encoded_forms(key: str) -> list[str]:
    """`key` as an error body may carry it: as is, percent-encoded, hex, and base64 (standard and URL-safe,
    at each of the three byte alignments it can have inside a longer encoded text: the characters that
    depend on the key's bytes alone). Longest first, so a longer form is cut before a shorter one."""
    raw = key.encode("utf-8")
    forms = {key, quote(key, safe=""), quote_plus(key), raw.hex(), raw.hex().upper()}
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw + b"\0\0").decode("ascii")
        first = -(-8 * offset // 6)  # the first character whose bits are all the key's
        last = (8 * (offset + len(raw))) // 6  # one past the last
        core = encoded[first:last]
        forms |= {core, core.replace("+", "-").replace("/", "_")}
    return sorted((f for f in forms if len(f) >= 8), key=len, reverse=True)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: PLR0913 - urllib's signature
        return None  # urlopen raises the 3xx as an HTTPError: `_post` makes it the clip's error


class _Deadline:
    """Cuts a request's sockets `seconds` after it began. A socket timeout bounds each read only: a server
    sending a byte a second never trips it. Shutting the socket down wakes the blocked read at once."""

    def __init__(self, seconds: float):
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:  # connecting took the whole deadline
                _cut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _cut(sock)

    def cancel(self) -> None:
        self._timer.cancel()


def _cut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown, also under TLS: no TLS close from the timer's thread
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class _Watched(http.client.HTTPConnection):
    def __init__(self, *args, deadline: _Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        super().connect()
        self._deadline.watch(self.sock)


class _WatchedHTTPS(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(functools.partial(_Watched, deadline=self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(
            functools.partial(_WatchedHTTPS, deadline=self.deadline), req, context=self._context
        )


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies from the environment included) with redirects refused and every
    connection it opens under `deadline`."""
    return urllib.request.build_opener(_NoRedirect, _HTTPHandler(deadline), _HTTPSHandler(deadline))


def _message_text(message: dict[str, Any]) -> str:
    """The text of an assistant message; TypeError when the message is not one (another server's reply)."""
    content = message["content"]
    if isinstance(content, list):  # some servers answer with content parts
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise TypeError("content is not text")
    return content
