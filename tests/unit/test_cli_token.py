"""`runcontrol token --roles Worker` mints a worker's token: role Worker, scope factory.runtime."""

from __future__ import annotations

import jwt
import pytest

from runcontrol.cli import main


def test_a_worker_token_carries_the_role_and_the_runtime_scope(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "cli-test-secret-" + "0123456789abcdef" * 2
    monkeypatch.setenv("RUNCONTROL_AUTH__HS256_SECRET", secret)
    argv = ["token", "--tenant", "t-1", "--project", "p-1", "--sub", "svc-w", "--roles", "Worker"]
    assert main(argv) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), secret, algorithms=["HS256"])
    assert (claims["tid"], claims["pid"], claims["sub"]) == ("t-1", "p-1", "svc-w")
    assert claims["roles"] == ["Worker"]
    assert "factory.runtime" in claims["scope"].split()
