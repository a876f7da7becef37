"""Who a worker token names, read without verifying it: only to name the lease holders the
server will make from it (``subject/instance``). The server verifies the token on every call
and takes the tenant and subject from it, never from what the worker sends."""

from __future__ import annotations

import jwt

from ..domain import WorkerIdentity, errors


def token_identity(token: str, instance_id: str) -> WorkerIdentity:
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise errors.ValidationFailed(f"the worker token is not a JWT: {exc}") from None
    tenant, subject = claims.get("tid"), claims.get("sub")
    if not isinstance(tenant, str) or not isinstance(subject, str):
        raise errors.ValidationFailed("the worker token names no tenant (tid) or subject (sub)")
    return WorkerIdentity(tenant, subject, instance_id)
