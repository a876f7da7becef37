"""OAuth2 bearer JWTs: who the caller is comes only from a verified token.

Tenant (``tid``), project (``pid``), subject (``sub``), roles (``roles``) and scopes (``scope``,
space-separated) are read from the token after its signature, expiry, issuer and audience are
checked. Nothing in a header or a body can change them. What the caller may then do is the
role table's (``runcontrol.domain.access``): role *and* scope must both allow an operation.
Both edges verify with ``TokenVerifier``; how the token arrives (a header, gRPC metadata) is
each edge's own business.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jwt

from ..config import AuthOptions
from ..domain import Principal, Role, errors
from ..domain.access import (
    OPERATION_SCOPE,
    RUNTIME,
    Operation,
    allows,
    effective_scopes,
    project_scope,
    scopes_of,
)
from ..domain.limits import MAX_NAME
from ..telemetry import annotate
from .errors import InsufficientScope, Unauthorized
from .storable import UNSTORABLE

__all__ = [
    "Caller",
    "TokenVerifier",
    "caller_from_claims",
    "jwks_document",
    "mint_dev_token",
    "permit",
    "watch_scope",
]

_RS_ALGORITHMS = ("RS256",)
# Verified tokens kept (by their SHA-256), at most this many, least recently used out first.
CACHE_SIZE = 4096
# A cached verification is trusted this long at most, as long as PyJWKClient keeps a fetched
# key: a key withdrawn from the JWKS stops being accepted within the same bound either way.
CACHE_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class Caller:
    """The verified identity of one request; ``scopes`` are its effective scopes (those of
    the token that its roles grant)."""

    principal: Principal
    scopes: frozenset[str]

    @property
    def tenant_id(self) -> str:
        return self.principal.tenant_id

    @property
    def project_scope(self) -> str | None:
        """The only project the caller may see and change; None: its whole tenant."""
        return project_scope(self.principal)


def permit(caller: Caller, operation: Operation) -> None:
    """Refuse ``operation`` unless the caller's effective scopes hold its scope (else 403
    ``insufficient-scope``) and one of its roles grants it (else 403 ``forbidden``)."""
    scope = OPERATION_SCOPE[operation]
    if scope not in caller.scopes:
        raise InsufficientScope(
            f"the token lacks the scope {scope}, or none of its roles grants it", scope=scope
        )
    if not allows(caller.principal.roles, caller.scopes, operation):
        roles = ", ".join(sorted(caller.principal.roles)) or "none"
        raise errors.Forbidden(f"{operation} is not an operation of the roles: {roles}")


def watch_scope(caller: Caller) -> str | None:
    """The project whose runs' events the caller may watch (None: its whole tenant): a worker
    (role Worker, scope ``factory.runtime``) the tenant's, whose attempts it runs; anyone else
    as a reader of runs over HTTP (``ReadRuns``, within its project unless a role spans the
    tenant)."""
    if Role.WORKER in caller.principal.roles and RUNTIME in caller.scopes:
        return None
    permit(caller, Operation.READ_RUNS)
    return caller.project_scope


def _invalid(detail: str) -> Unauthorized:
    return Unauthorized(detail, oauth_error="invalid_token")


def _identity(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise _invalid(f"the token lacks a valid {name!r} claim")
    if UNSTORABLE.search(value):
        raise _invalid(f"the token's {name!r} claim has invalid characters")
    return value


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def caller_from_claims(claims: dict[str, Any]) -> Caller:
    known_roles = {r.value: r for r in Role}
    roles = frozenset(known_roles[r] for r in _strings(claims.get("roles")) if r in known_roles)
    scopes = frozenset(_strings(claims.get("scope")) or _strings(claims.get("scp")))
    principal = Principal(
        subject=_identity(claims, "sub"),
        tenant_id=_identity(claims, "tid"),
        project_id=_identity(claims, "pid"),
        roles=roles,
    )
    return Caller(principal, effective_scopes(roles, scopes))


class TokenVerifier:
    """Verifies RS256 tokens against a JWKS and, where allowed, HS256 tokens with the shared
    secret. Built only from a configuration that can verify: ``AuthNotConfigured`` otherwise.

    A verified token's caller is cached by the token's SHA-256 (a bounded LRU of
    ``cache_size``), until the token's ``exp`` or ``CACHE_SECONDS`` after its verification,
    whichever comes first: a worker or client sending the same token on every request pays
    one signature check, not one per request (issue 24). Only successful verifications are
    kept; a refused token is checked again each time. Revocation is what it was: a token is
    valid until its ``exp`` (no token is revoked one by one); a signing key withdrawn from a
    JWKS URL stops being accepted within ``CACHE_SECONDS``, as PyJWKClient's key cache
    already allowed, and a change of the JWKS file (its mtime) empties the cache at once."""

    def __init__(
        self,
        options: AuthOptions,
        *,
        cache_size: int = CACHE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        options.check()
        self._options = options
        self._cache: OrderedDict[bytes, tuple[Caller, float]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_mtime: float | None = None  # the JWKS file's, when the cache was filled
        self._clock = clock
        self._mutex = threading.Lock()  # verify runs in threads when it fetches keys
        self._secret = options.hs256_key()
        self._jwks_client = (
            jwt.PyJWKClient(options.jwks_url, cache_keys=True, lifespan=300)
            if options.jwks_url
            else None
        )
        self._jwks_file: tuple[float, jwt.PyJWKSet] | None = None

    @property
    def fetches_keys(self) -> bool:
        """True when verification may do network I/O (a JWKS URL)."""
        return self._jwks_client is not None

    def _file_key(self, kid: str | None) -> Any:
        path = self._options.jwks_file
        assert path is not None
        mtime = os.stat(path).st_mtime
        if self._jwks_file is None or self._jwks_file[0] != mtime:
            with open(path, encoding="utf-8") as fh:
                self._jwks_file = (mtime, jwt.PyJWKSet.from_json(fh.read()))
        keys = self._jwks_file[1].keys
        for key in keys:
            if (kid is None and len(keys) == 1) or key.key_id == kid:
                return key.key
        raise _invalid("the token's signing key is unknown")

    def _key(self, token: str, header: dict[str, Any]) -> tuple[Any, str]:
        alg = header.get("alg")
        if alg == "HS256" and self._secret:
            return self._secret, alg
        if alg in _RS_ALGORITHMS:
            if self._options.jwks_file:
                return self._file_key(header.get("kid")), alg
            if self._jwks_client is not None:
                try:
                    return self._jwks_client.get_signing_key_from_jwt(token).key, alg
                except jwt.PyJWKClientConnectionError as exc:
                    raise errors.Unavailable(f"the JWKS endpoint did not answer: {exc}") from None
        raise _invalid(f"tokens signed with {alg!r} are not accepted")

    def verify(self, token: str) -> Caller:
        key = hashlib.sha256(token.encode()).digest()
        cached = self._cached(key)
        if cached is not None:
            return cached
        caller, exp = self._verify(token)
        until = min(exp, self._clock() + CACHE_SECONDS)
        with self._mutex:
            self._cache[key] = (caller, until)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return caller

    def _cached(self, key: bytes) -> Caller | None:
        mtime: float | None = None
        if self._options.jwks_file:
            try:
                mtime = os.stat(self._options.jwks_file).st_mtime
            except OSError:
                mtime = -1.0  # gone: nothing cached stands (the check itself will refuse)
        now = self._clock()
        with self._mutex:
            if mtime != self._cache_mtime:
                self._cache.clear()
                self._cache_mtime = mtime
                return None
            found = self._cache.get(key)
            if found is None:
                return None
            if now >= found[1]:
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            return found[0]

    def _verify(self, token: str) -> tuple[Caller, float]:
        """The token's caller and its ``exp``, checked in full."""
        o = self._options
        try:
            header = jwt.get_unverified_header(token)
            key, alg = self._key(token, header)
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=o.audience,
                issuer=o.issuer,
                leeway=o.leeway_seconds,
                options={"require": ["exp"], "verify_aud": o.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise _invalid("the token has expired") from None
        except jwt.PyJWTError as exc:
            raise _invalid(f"the token is invalid: {exc}") from None
        except (OSError, ValueError) as exc:
            raise _invalid(f"the token cannot be verified: {exc}") from None
        return caller_from_claims(claims), float(claims["exp"])

    async def verify_async(self, token: str) -> Caller:
        if self.fetches_keys:
            caller = await asyncio.to_thread(self.verify, token)
        else:
            caller = self.verify(token)
        annotate(tenant_id=caller.tenant_id)  # the edge span's tenant (HTTP and gRPC)
        return caller


def mint_dev_token(
    secret: str,
    tenant: str,
    project: str,
    subject: str,
    roles: Iterable[str],
    scopes: Iterable[str] | None = None,
    ttl_s: int = 3600,
    *,
    issuer: str | None = None,
    audience: str | None = None,
) -> str:
    """An HS256 token for local development (``runcontrol token``).

    ``scopes=None`` grants the scopes of ``roles`` (the role table), and nothing else.
    """
    now = int(time.time())
    roles = [str(r) for r in roles]
    if scopes is None:
        known = {r.value: r for r in Role}
        scopes = sorted(scopes_of(known[r] for r in roles if r in known))
    claims: dict[str, Any] = {
        "sub": subject,
        "tid": tenant,
        "pid": project,
        "roles": roles,
        "scope": " ".join(scopes),
        "iat": now,
        "nbf": now,
        "exp": now + int(ttl_s),
        "jti": str(uuid.uuid4()),
    }
    if issuer is not None:
        claims["iss"] = issuer
    if audience is not None:
        claims["aud"] = audience
    return jwt.encode(claims, secret, algorithm="HS256")


def jwks_document(public_keys: dict[str, Any]) -> str:
    """A JWKS JSON document for ``{kid: public_key}`` (tests and local RS256 setups)."""
    keys = []
    for kid, key in public_keys.items():
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
        jwk.update({"kid": kid, "use": "sig", "alg": "RS256"})
        keys.append(jwk)
    return json.dumps({"keys": keys})
