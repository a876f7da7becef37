"""Auth fails closed: no built-in secret, a deploy without a key refuses to start, HS256 is
refused beside a JWKS unless enabled, and the dev secret of ``runcontrol up --dev`` is random,
per data dir, and the one ``runcontrol token`` signs with.

Each deployment here is a second Serve application beside the session's, on its own prefix.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from api_harness import (
    AUDIENCE,
    ISSUER,
    PROJECT,
    RSA_KID,
    SECRET,
    Api,
    api_settings,
    assert_problem,
    deploy_app,
    extra_app,
)

from runcontrol.api.auth import RUNS_READ, RUNS_WRITE, jwks_document
from runcontrol.cli.tokens import dev_secret_file, with_dev_auth
from runcontrol.config import AuthNotConfigured, AuthOptions, Settings

ROOT = Path(__file__).resolve().parents[2]
# The default this repository used to ship: it must verify nothing, anywhere.
PUBLISHED_SECRET = "runcontrol-dev-secret-change-me-0123456789"


def forged(tenant: str, secret: str = PUBLISHED_SECRET, **extra: Any) -> str:
    now = int(time.time())
    claims = {
        "sub": "mallory",
        "tid": tenant,
        "pid": PROJECT,
        "roles": ["PlatformAdmin"],
        "scope": f"{RUNS_READ} {RUNS_WRITE}",
        "iat": now,
        "exp": now + 600,
        **extra,
    }
    return jwt.encode(claims, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def jwks_file(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("strict") / "jwks.json"
    path.write_text(jwks_document({RSA_KID: api.rsa_key.public_key()}))
    return path


@pytest.fixture(scope="module")
def strict(api: Api, ray_runtime: Any, jwks_file: Path) -> Iterator[str]:
    """A deployment with a JWKS and, left in its environment, a shared secret."""

    settings = api_settings(ray_runtime, jwks_file)
    settings["auth"] = {
        "hs256_secret": SECRET,
        "jwks_file": str(jwks_file),
        "issuer": ISSUER,
        "audience": AUDIENCE,
    }
    with extra_app(api, "strict", ray_runtime.owner_url, settings) as url:
        yield url


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNCONTROL_AUTH__")}
    env.update(extra)
    return env


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    runcontrol = Path(sys.executable).with_name("runcontrol")
    return subprocess.run(
        [str(runcontrol), *args],
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_there_is_no_built_in_secret() -> None:
    options = Settings().auth
    assert options.hs256_secret is None and options.hs256_secret_file is None
    with pytest.raises(AuthNotConfigured, match="no token verification key"):
        options.check()
    with pytest.raises(AuthNotConfigured, match="shorter than 32 bytes"):
        AuthOptions(hs256_secret="short-secret").check()  # type: ignore[arg-type]


def test_forged_tokens_with_the_published_secret_are_refused(
    api: Api, strict: str, tenant: str
) -> None:
    for base in (api.base_url, strict):
        with api.client(forged(tenant, iss=ISSUER, aud=AUDIENCE)) as http:
            response = http.get(f"{base}/factory/runs")
        assert_problem(response, 401, "unauthorized")


def test_hs256_is_refused_beside_a_jwks_unless_enabled(api: Api, strict: str, tenant: str) -> None:
    good_claims = {"sub": "alice", "tid": tenant, "pid": PROJECT, "roles": ["Observer"]}
    hs256 = api.token(tenant, "alice", ["Observer"])  # signed with the secret it still holds
    with api.client(hs256) as http:
        assert http.get(f"{api.base_url}/factory/runs").status_code == 200  # enabled there
        refused = http.get(f"{strict}/factory/runs")
    body = assert_problem(refused, 401, "unauthorized")
    assert "HS256" in body["detail"]
    rs256 = api.rs256_token({**good_claims, "scope": RUNS_READ})
    with api.client(rs256) as http:
        assert http.get(f"{strict}/factory/runs").status_code == 200


def _refused_at_start(ray_runtime: Any, name: str, match: str, **options: Any) -> None:
    """The deployment fails, and its status says why (the replica's own error)."""
    from ray import serve

    try:
        with pytest.raises(RuntimeError, match=f"Deploying application {name} failed"):
            # one constructor retry, not Serve's default 20: the same error every time
            deploy_app(name, ray_runtime.owner_url, None, max_constructor_retry_count=1, **options)
        status = serve.status().applications[name].deployments[f"RunControlApi-{name}"]
        assert "AuthNotConfigured" in status.message, status.message
        assert match in status.message, status.message
    finally:
        serve.delete(name)


def test_the_shipped_serve_config_refuses_to_start_without_a_key(
    api: Api, ray_runtime: Any
) -> None:
    """``serve deploy serve-config.yaml`` as shipped (no key set): the replica refuses."""
    config = yaml.safe_load((ROOT / "serve-config.yaml").read_text())
    (app,) = config["applications"]
    env = dict(app["runtime_env"]["env_vars"])
    assert not any(k.startswith("RUNCONTROL_AUTH__") for k in env), "ships a key: update test"
    actor = {"num_cpus": 0, "runtime_env": {"env_vars": env}}
    _refused_at_start(ray_runtime, "nokey", "no token verification key", ray_actor_options=actor)


def test_a_jwks_without_issuer_and_audience_refuses_to_start(
    api: Api, ray_runtime: Any, jwks_file: Path
) -> None:
    env = {"RUNCONTROL_AUTH__JWKS_FILE": str(jwks_file)}
    actor = {"num_cpus": 0, "runtime_env": {"env_vars": env}}
    _refused_at_start(
        ray_runtime, "noaud", "ISSUER and RUNCONTROL_AUTH__AUDIENCE", ray_actor_options=actor
    )


def test_runcontrol_up_without_a_key_or_dev_refuses_at_once(tmp_path: Path) -> None:
    done = _cli("up", "--no-workers", RUNCONTROL_DATA_DIR=str(tmp_path / "pgdata"))
    assert done.returncode != 0
    assert "no token verification key" in done.stderr
    assert "runcontrol up --dev" in done.stderr
    assert not (tmp_path / "pgdata").exists()  # refused before starting anything


def test_dev_mode_secret_is_random_per_data_dir_and_signs_cli_tokens(
    api: Api, ray_runtime: Any, tmp_path: Path, tenant: str
) -> None:

    data_dir = str(tmp_path / "pgdata")
    no_secret = _cli(
        "token",
        "--tenant",
        tenant,
        "--project",
        PROJECT,
        "--sub",
        "x",
        RUNCONTROL_DATA_DIR=data_dir,
    )
    assert no_secret.returncode != 0 and "runcontrol up --dev" in no_secret.stderr

    settings = Settings(data_dir=data_dir)
    app_settings = with_dev_auth(settings)  # what `runcontrol up --dev` does
    path = dev_secret_file(settings)
    assert app_settings == {"auth": {"hs256_secret_file": str(path)}}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) >= 48 and secret != PUBLISHED_SECRET
    assert with_dev_auth(Settings(data_dir=data_dir)) == app_settings  # reused, not remade
    assert path.read_text().strip() == secret
    other = Settings(data_dir=str(tmp_path / "other" / "pgdata"))
    with_dev_auth(other)
    assert dev_secret_file(other).read_text().strip() != secret

    minted = _cli(
        "token",
        "--tenant",
        tenant,
        "--project",
        PROJECT,
        "--sub",
        "olga",
        "--roles",
        "Observer",
        RUNCONTROL_DATA_DIR=data_dir,
    )
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip()
    assert jwt.decode(token, secret, algorithms=["HS256"])["scope"].split() == [
        "factory.approvals.read",
        "factory.runs.read",
    ]
    assert app_settings is not None
    dev_settings = {**ray_runtime.settings.model_dump(mode="json"), **app_settings}
    with extra_app(api, "dev", ray_runtime.owner_url, dev_settings) as base:
        with api.client(token) as http:
            assert http.get(f"{base}/factory/runs").status_code == 200
            submitted = http.post(f"{base}/factory/runs", json={}, headers={"Idempotency-Key": "k"})
            assert_problem(submitted, 403, "insufficient-scope")
        with api.client(forged(tenant)) as http:
            assert_problem(http.get(f"{base}/factory/runs"), 401, "unauthorized")
        with api.client(api.token(tenant, "alice", ["Observer"])) as http:  # another secret
            assert_problem(http.get(f"{base}/factory/runs"), 401, "unauthorized")
