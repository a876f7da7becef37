"""A small OAuth2 authorization server on loopback for the console's sign-in test.

It implements what the console relies on, and checks it as a provider would: ``/authorize``
(response_type ``code``, the registered client id and redirect URI, an S256 ``code_challenge``)
answers at once with a redirect carrying a one-time code (the user is taken as signed in), and
``/token`` trades the code for an access token only with the ``code_verifier`` whose SHA-256 is
the challenge (RFC 7636), answering with CORS headers as an SPA-friendly provider does. The
access token is whatever ``mint(subject)`` returns: one the service under test verifies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass
class Grant:
    challenge: str
    redirect_uri: str


def _no_key(subject: str) -> str:
    raise RuntimeError("the provider has no key to sign tokens with yet")


@dataclass
class Provider:
    client_id: str
    subject: str
    mint: Callable[[str], str] = _no_key
    codes: dict[str, Grant] = field(default_factory=dict)
    # what happened, for the test to check: ("authorize", params) and ("token", outcome)
    seen: list[tuple[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def authorize(self, params: dict[str, str]) -> tuple[int, dict[str, str]]:
        with self.lock:
            self.seen.append(("authorize", params))
        ok = (
            params.get("response_type") == "code"
            and params.get("client_id") == self.client_id
            and params.get("code_challenge_method") == "S256"
            and len(params.get("code_challenge", "")) == 43
            and params.get("redirect_uri", "").startswith("http://127.0.0.1:")
        )
        redirect = params.get("redirect_uri", "")
        if not ok:
            return 400, {}
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = Grant(params["code_challenge"], redirect)
        query = urlencode({"code": code, "state": params.get("state", "")})
        return 302, {"Location": f"{redirect}?{query}"}

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            grant = self.codes.pop(form.get("code", ""), None)  # one use only
        if (
            grant is None
            or form.get("grant_type") != "authorization_code"
            or form.get("client_id") != self.client_id
            or form.get("redirect_uri") != grant.redirect_uri
        ):
            outcome: tuple[int, dict[str, Any]] = (400, {"error": "invalid_grant"})
        elif s256(form.get("code_verifier", "")) != grant.challenge:
            outcome = (400, {"error": "invalid_grant", "error_description": "PKCE mismatch"})
        else:
            token = self.mint(self.subject)
            outcome = (200, {"access_token": token, "token_type": "Bearer", "expires_in": 3600})
        with self.lock:
            self.seen.append(("token", outcome[0]))
        return outcome


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _cors(self) -> None:
            self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin") or "*")
            self.send_header("Access-Control-Allow-Headers", "Content-Type")

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/authorize":
                self.send_error(404)
                return
            params = {k: v[0] for k, v in parse_qs(url.query).items()}
            status, headers = provider.authorize(params)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_OPTIONS(self) -> None:
            self.send_response(204)
            self._cors()
            self.send_header("Access-Control-Allow-Methods", "POST")
            self.end_headers()

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/token":
                self.send_error(404)
                return
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            status, body = provider.token(form)
            data = json.dumps(body).encode()
            self.send_response(status)
            self._cors()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class ProviderServer:
    """The provider, served on ``127.0.0.1:port`` from a thread until ``close``."""

    def __init__(self, provider: Provider, port: int) -> None:
        self.provider = provider
        self.url = f"http://127.0.0.1:{port}"
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(provider))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
