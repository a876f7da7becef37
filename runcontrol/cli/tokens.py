"""Development tokens: ``runcontrol token`` mints HS256 bearer tokens, and ``runcontrol up
--dev`` signs with a random secret kept beside the data dir (no built-in secret)."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path
from typing import Any

from .. import embedded
from ..config import AuthNotConfigured, Settings
from ..domain import Role
from .output import say


def dev_secret_file(settings: Settings) -> Path:
    """Where ``runcontrol up --dev`` keeps its random HS256 secret: beside the data dir, so
    each install (data dir) has its own and ``runcontrol token`` finds it."""
    data_dir = Path(settings.data_dir or embedded.default_data_dir()).expanduser().resolve()
    return data_dir.with_name(data_dir.name + ".dev-secret")


def _ensure_dev_secret(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(secrets.token_urlsafe(48) + "\n")


def with_dev_auth(settings: Settings) -> dict[str, Any] | None:
    """``--dev``: with no key configured, sign with a random secret of this data dir. Answers
    the HTTP app's settings override, or None when a key is configured (it is used as is)."""
    auth = settings.auth
    if auth.uses_jwks or auth.hs256_secret is not None or auth.hs256_secret_file:
        return None
    path = dev_secret_file(settings)
    _ensure_dev_secret(path)
    settings.auth = auth.model_copy(update={"hs256_secret_file": str(path)})
    say(f"dev mode: tokens are signed with the random secret in {path}")
    return {"auth": {"hs256_secret_file": str(path)}}


def mint(
    settings: Settings,
    subject: str,
    roles: list[str],
    tenant: str,
    project: str,
    scopes: list[str] | None = None,
) -> str:
    """A bearer token signed with the configured HS256 secret, else with this data dir's dev
    secret (``with_dev_auth``)."""
    from ..api.auth import mint_dev_token  # pyjwt comes with the `ray` extra: only this needs it

    auth = settings.auth
    if auth.uses_jwks and not auth.hs256_with_jwks:
        raise SystemExit(
            "runcontrol: this configuration verifies RS256 tokens against a JWKS and refuses "
            "HS256: get a token from your identity provider"
        )
    try:
        secret = auth.shared_secret()
    except AuthNotConfigured as exc:
        raise SystemExit(f"runcontrol: {exc}") from None
    if secret is None:
        dev = dev_secret_file(settings)
        if not dev.exists():
            raise SystemExit(
                "runcontrol: no HS256 secret to sign with: set RUNCONTROL_AUTH__HS256_SECRET "
                f"(or _HS256_SECRET_FILE), or start `runcontrol up --dev` once (it keeps {dev})"
            )
        secret = dev.read_text(encoding="utf-8").strip()
    return mint_dev_token(
        secret,
        tenant,
        project,
        subject,
        roles,
        scopes,
        issuer=auth.issuer,
        audience=auth.audience,
    )


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _cmd_token(args: argparse.Namespace) -> int:
    roles = _names(args.roles) or []
    unknown = sorted(set(roles) - {r.value for r in Role})
    if unknown:
        raise SystemExit(f"runcontrol: unknown roles {unknown}; known: {[r.value for r in Role]}")
    scopes = _names(args.scopes)
    print(mint(Settings(), args.sub, roles, args.tenant, args.project, scopes))
    return 0


def add_token(sub: Any) -> None:
    token = sub.add_parser("token", help="mint a local development bearer token (HS256)")
    token.add_argument("--tenant", required=True)
    token.add_argument("--project", required=True)
    token.add_argument("--sub", required=True)
    token.add_argument("--roles", default="Requester", help="comma-separated roles")
    token.add_argument(
        "--scopes",
        default=None,
        help="comma-separated scopes (default: those the roles grant; the server honours "
        "only scopes a role of the token grants)",
    )
    token.set_defaults(func=_cmd_token)
