"""``runcontrol worker --app``: a bad path is one line on stderr and exit code 2, before any
Ray or gRPC connection is made; a good one names a ``Worker``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runcontrol.cli import main
from runcontrol.sdk import AppNotFound, Worker, load_app

BAD = [
    ("no_such_module_xyz:worker", "cannot import 'no_such_module_xyz'"),
    ("runcontrol.sdk.echo", "expected package.module:attribute"),
    ("runcontrol.sdk.echo:nope", "has no 'nope'"),
    ("runcontrol.sdk:Worker", "is a type, not a Worker"),
    (":worker", "expected package.module:attribute"),
]


@pytest.mark.parametrize(("path", "says"), BAD)
def test_a_bad_app_is_one_line_and_exit_code_2(
    path: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--app", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("runcontrol worker: --app")
    assert says in err


def test_a_bad_app_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runcontrol.cli", "worker", "--app", "nope.nope:worker"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "cannot import 'nope.nope'" in done.stderr


def test_an_app_that_fails_to_import_is_one_line_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "boom_app.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppNotFound) as raised:
        load_app("boom_app:worker")
    assert str(raised.value) == (
        "--app 'boom_app:worker': importing 'boom_app' failed: RuntimeError: boom second line"
    )


def test_a_good_app_and_serving_some_of_its_agents() -> None:
    app = load_app("runcontrol.sdk.echo:worker")
    assert isinstance(app, Worker)
    assert set(app.agents) == {"planner", "applier", "reporter"}
    assert list(app.only(["planner"]).agents) == ["planner"]
    with pytest.raises(ValueError, match="no agent 'x'"):
        app.only(["x"])


def test_the_stall_hint_names_the_users_own_app() -> None:
    """Issue 34: followed literally, the hint started echo agents under the user's agent."""
    from runcontrol.cli.demo import stall_hint

    hint = stall_hint("acme", "planner", 2, 30)
    assert "runcontrol worker --tenant acme --sub worker --app PACKAGE.MODULE:WORKER" in hint
    assert "--agents" not in hint and "'planner'" in hint
