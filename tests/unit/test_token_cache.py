"""The edge's verified-token cache (issue 24): a token verified once is not checked again
until its ``exp`` (or ``CACHE_SECONDS``); refused tokens are never kept; the cache is a bounded
LRU; a changed JWKS file empties it. HS256 and RS256 tokens signed for real, no network."""

from __future__ import annotations

import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from runcontrol.config import AuthOptions
from runcontrol.edge.auth import CACHE_SECONDS, TokenVerifier, jwks_document, mint_dev_token
from runcontrol.edge.errors import Unauthorized

SECRET = "s" * 32


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _token(subject: str = "alice", ttl_s: int = 600, secret: str = SECRET) -> str:
    return mint_dev_token(secret, "t-1", "p-1", subject, ["requester"], ttl_s=ttl_s)


def _verifier(clock: Clock, size: int = 8) -> TokenVerifier:
    return TokenVerifier(AuthOptions(hs256_secret=SECRET), cache_size=size, clock=clock)


def test_a_verified_token_is_answered_from_the_cache_until_its_exp() -> None:
    clock = Clock()
    v = _verifier(clock)
    token = _token(ttl_s=120)
    first = v.verify(token)
    assert first.principal.subject == "alice"
    assert v.verify(token) is first  # no second signature check: the same Caller
    clock.now += 118
    assert v.verify(token) is first
    clock.now += 3  # past exp by the cache's clock: checked in full again
    again = v.verify(token)
    assert again == first and again is not first


def test_a_cached_verification_lasts_cache_seconds_at_most() -> None:
    clock = Clock()
    v = _verifier(clock)
    token = _token(ttl_s=24 * 3600)
    first = v.verify(token)
    clock.now += CACHE_SECONDS - 1
    assert v.verify(token) is first
    clock.now += 2
    assert v.verify(token) is not first


def test_a_refused_token_is_never_cached() -> None:
    v = _verifier(Clock())
    forged = _token(secret="x" * 32)
    for _ in range(2):
        with pytest.raises(Unauthorized):
            v.verify(forged)
    expired = _token(ttl_s=-3600)
    with pytest.raises(Unauthorized, match="expired"):
        v.verify(expired)


def test_the_cache_is_a_bounded_lru() -> None:
    v = _verifier(Clock(), size=2)
    a, b, c = (_token(s) for s in ("a", "b", "c"))
    ca, cb = v.verify(a), v.verify(b)
    assert v.verify(a) is ca  # a is now the most recent
    v.verify(c)  # evicts b, the least recently used
    assert v.verify(a) is ca
    assert v.verify(b) is not cb


def test_a_changed_jwks_file_empties_the_cache(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "jwks.json"
    path.write_text(jwks_document({"k1": key.public_key()}))
    options = AuthOptions(jwks_file=str(path), issuer="iss", audience="aud")
    v = TokenVerifier(options, clock=Clock())
    now = int(time.time())
    claims = {"sub": "s", "tid": "t", "pid": "p", "iss": "iss", "aud": "aud", "exp": now + 600}
    token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
    first = v.verify(token)
    assert v.verify(token) is first
    # The key is withdrawn (the file now holds another): the cached verification goes too.
    path.write_text(jwks_document({"k2": other.public_key()}))
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + 10))  # a rewrite within the same tick
    with pytest.raises(Unauthorized, match="unknown"):
        v.verify(token)
