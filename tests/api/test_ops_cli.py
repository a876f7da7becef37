"""The people's CLI (``runcontrol runs|approvals|webhooks|events``) against the real app over
HTTP: the token from ``RUNCONTROL_TOKEN`` or the config file, tables, ``--json``, problem+json
errors, and ``tail`` resuming with ``Last-Event-ID``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from api_harness import TenantView

from runcontrol.cli import main
from runcontrol.cli.schedules import THROUGH_PAUSE
from runcontrol.commands import AppendOutput
from runcontrol.domain import Role
from runcontrol.domain.output import OutputChunk


def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, token: str, *argv: str
) -> tuple[int, str, str]:
    monkeypatch.setenv("RUNCONTROL_TOKEN", token)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def env(t: TenantView, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("RUNCONTROL_URL", t.api.base_url)
    monkeypatch.setenv("RUNCONTROL_CONFIG", str(tmp_path / "absent.toml"))


def test_runs_submit_list_show_tail_and_cancel(t, env, capsys, monkeypatch) -> None:
    t.publish()
    token = t.token("alice", Role.REQUESTER)
    code, out, err = cli(
        capsys, monkeypatch, token, "runs", "submit", "--workflow", t.workflow,
        "--model-profile", "code-agent", "--input", '{"repository": "r"}',
        "--max-cost-usd", "5", "--max-minutes", "10", "--key", "k-1", "--json",
    )  # fmt: skip
    assert code == 0, err
    run_id = json.loads(out)["runId"]
    # the same key answers the same run (idempotent)
    code, out, _ = cli(
        capsys, monkeypatch, token, "runs", "submit", "--workflow", t.workflow,
        "--model-profile", "code-agent", "--input", '{"repository": "r"}',
        "--max-cost-usd", "5", "--max-minutes", "10", "--key", "k-1",
    )  # fmt: skip
    assert code == 0 and f"run              {run_id}" in out and "k-1" in out

    code, out, _ = cli(capsys, monkeypatch, token, "runs", "list", "--json")
    assert code == 0 and [r["runId"] for r in json.loads(out)] == [run_id]
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "list")
    header, row = out.splitlines()
    assert header.split()[:3] == ["RUN", "STATE", "WORKFLOW"]
    assert row.split()[0] == run_id and t.workflow in row

    claim = t.claim(run_id)
    chunks = (
        OutputChunk(1, text="hello "),
        OutputChunk(2, text="world\n"),
        OutputChunk(3, data=[1]),
    )
    t._call(t.runtime.client.send(AppendOutput(**claim.fenced(), chunks=chunks)))
    t.succeed(claim)
    t.wait_state(run_id, "Completed")
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "tail", run_id, "--output")
    assert code == 0 and out == "hello world\n[1]\n"
    code, out, _ = cli(
        capsys, monkeypatch, token, "runs", "tail", run_id, "--output", "--after", "1", "--json"
    )
    assert code == 0
    assert [
        (c["position"], c.get("text"), c.get("data")) for c in map(json.loads, out.splitlines())
    ] == [
        (2, "world\n", None),
        (3, None, [1]),
    ]
    history = t.requester().get(f"/factory/runs/{run_id}/events/history").json()
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "tail", run_id, "--json")
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == history
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "tail", run_id, "--after", "2")
    lines = out.splitlines()
    assert [int(line.split()[0]) for line in lines] == [e["seq"] for e in history[2:]]
    assert lines[-1].split()[2] == "RunCompleted"

    code, out, _ = cli(capsys, monkeypatch, token, "runs", "show", run_id)
    assert code == 0 and "Completed" in out and "steps:" in out and "1:only  Succeeded" in out

    # the resulting state is observed, not assumed: a finished run stays as it is
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "cancel", run_id, "--reason", "late")
    assert code == 0 and out.strip() == f"run {run_id} is Completed"
    other = t.submit()
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "cancel", other, "--reason", "stop")
    assert code == 0 and out.strip() in (f"run {other} is Cancelled", f"run {other} is Cancelling")


def test_errors_render_the_problem(t, env, capsys, monkeypatch) -> None:
    token = t.token("alice", Role.REQUESTER)
    code, _, err = cli(
        capsys, monkeypatch, token, "runs", "show", "00000000-0000-0000-0000-0000000000aa"
    )
    assert code == 1
    assert err.startswith("runcontrol: 404 ") and "(run-not-found)" in err
    code, _, err = cli(capsys, monkeypatch, "not-a-jwt", "runs", "list")
    assert code == 1 and "401" in err and "(unauthorized)" in err
    code, _, err = cli(capsys, monkeypatch, token, "runs", "show", "nope")
    assert code == 1 and "422" in err
    monkeypatch.setenv("RUNCONTROL_URL", "http://127.0.0.1:9")
    code, _, err = cli(capsys, monkeypatch, token, "runs", "list")
    assert code == 3 and "cannot reach http://127.0.0.1:9" in err


def test_token_and_url_from_the_config_file(t, capsys, monkeypatch, tmp_path) -> None:
    config = tmp_path / "cli.toml"
    config.write_text(f'url = "{t.api.base_url}"\ntoken = "{t.token("alice", Role.REQUESTER)}"\n')
    monkeypatch.setenv("RUNCONTROL_CONFIG", str(config))
    monkeypatch.delenv("RUNCONTROL_TOKEN", raising=False)
    monkeypatch.delenv("RUNCONTROL_URL", raising=False)
    assert main(["runs", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    config.unlink()
    assert main(["runs", "list"]) == 1
    assert "no token" in capsys.readouterr().err


def test_approvals_list_show_approve_and_reject(t, env, capsys, monkeypatch) -> None:
    run_id, _, pending = t.waiting_for_approval()
    reviewer = t.token("rita", Role.REVIEWER)
    requester = t.token("alice", Role.REQUESTER, Role.REVIEWER)  # may decide, not its own run
    aid = pending["approvalId"]
    code, out, _ = cli(capsys, monkeypatch, reviewer, "approvals", "list", "--state", "Pending")
    assert code == 0 and aid in out and run_id in out
    code, out, _ = cli(capsys, monkeypatch, reviewer, "approvals", "show", aid)
    assert code == 0 and pending["proposalHash"] in out
    # the requester may never decide: the server's 403, rendered
    code, _, err = cli(capsys, monkeypatch, requester, "approvals", "approve", aid)
    assert code == 1 and "403" in err and "(separation-of-duties)" in err
    code, _, err = cli(
        capsys, monkeypatch, reviewer, "approvals", "approve", aid, "--proposal-hash", "sha256:x"
    )
    assert code == 1 and "409" in err
    code, out, err = cli(capsys, monkeypatch, reviewer, "approvals", "approve", aid, "--json")
    assert code == 0, err
    assert json.loads(out)["state"] == "Approved"
    t.succeed(t.claim(run_id))  # the decision resumed it; finish it before the next claim

    _, _, second = t.waiting_for_approval(2)
    with pytest.raises(SystemExit) as usage:  # argparse: rejecting needs a reason
        cli(capsys, monkeypatch, reviewer, "approvals", "reject", second["approvalId"])
    assert usage.value.code == 2 and "--reason" in capsys.readouterr().err
    code, out, _ = cli(
        capsys, monkeypatch, reviewer, "approvals", "reject", second["approvalId"], "--reason", "no"
    )
    assert code == 0 and "Rejected" in out


def test_approvals_decide_many_and_runs_cancel_many(t, env, capsys, monkeypatch) -> None:
    first, _, a = t.waiting_for_approval()
    second, _, b = t.waiting_for_approval()
    reviewer = t.token("rita", Role.REVIEWER)
    code, out, err = cli(capsys, monkeypatch, reviewer, "approvals", "decide-many", "approve")
    assert code == 1 and "--all-pending" in err  # nothing named
    code, out, err = cli(
        capsys, monkeypatch, reviewer, "approvals", "decide-many", "approve", "--all-pending"
    )
    assert code == 0, err
    assert a["approvalId"] in out and b["approvalId"] in out and "2 decided" in out
    code, out, err = cli(
        capsys, monkeypatch, reviewer, "approvals", "decide-many", "approve", a["approvalId"]
    )
    assert code == 1 and "conflict" in out and "1 of 1 decisions refused" in err

    requester = t.token("alice", Role.REQUESTER)
    code, out, err = cli(
        capsys,
        monkeypatch,
        requester,
        "runs",
        "cancel-many",
        first,
        second,
        "--reason",
        "done",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["counts"]["accepted"] == 2
    assert t.wait_state(first, "Cancelled") and t.wait_state(second, "Cancelled")


def test_schedules_create_show_pause_backfill_and_delete(t, env, capsys, monkeypatch) -> None:
    t.publish()
    token = t.token("alice", Role.REQUESTER)
    code, out, err = cli(
        capsys, monkeypatch, token, "schedules", "create", "--workflow", t.workflow,
        "--model-profile", "code-agent", "--cron", "0 3 * * 1-5", "--time-zone",
        "Europe/Berlin", "--start", "2026-01-01T00:00:00+00:00", "--json",
    )  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    sid = created["scheduleId"]
    assert created["cron"] == "0 3 * * 1-5" and len(created["nextFireTimes"]) == 5
    code, _, err = cli(capsys, monkeypatch, token, "schedules", "create", "--workflow", "w",
                       "--model-profile", "m")  # fmt: skip
    assert code == 1 and "--cron or --every" in err
    code, out, err = cli(capsys, monkeypatch, token, "schedules", "pause", sid, "--note", "hold")
    assert code == 0 and out.strip() == f"schedule {sid} paused"
    code, out, _ = cli(capsys, monkeypatch, token, "schedules", "show", sid)
    assert "hold" in out and "0 3 * * 1-5 (Europe/Berlin)" in out
    code, out, err = cli(  # through the pause, and said so
        capsys, monkeypatch, token, "schedules", "backfill", sid, "--start",
        "2026-03-02T00:00:00Z", "--end", "2026-03-07T00:00:00Z", "--overlap", "allow-all",
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == "5 started, 0 skipped, 0 buffered, 0 alreadyFired" + THROUGH_PAUSE
    code, out, _ = cli(capsys, monkeypatch, token, "schedules", "resume", sid)
    assert code == 0 and "resumed" in out
    code, out, _ = cli(capsys, monkeypatch, token, "schedules", "list")
    assert sid in out
    code, out, _ = cli(capsys, monkeypatch, token, "schedules", "delete", sid)
    assert code == 0
    code, _, err = cli(capsys, monkeypatch, token, "schedules", "show", sid)
    assert code == 1 and "404" in err


def test_ops_suspend_and_resume_round_trip(t, env, capsys, monkeypatch) -> None:
    t.publish()
    run_id = t.submit()
    token = t.token("olga", Role.OPERATOR)

    code, out, err = cli(
        capsys, monkeypatch, token, "ops", "suspend", run_id, "--reason", "incident 42"
    )
    assert code == 0, err
    assert out.strip() == f"run {run_id} is Running (suspended)"
    assert t.run(run_id)["suspended"] is True
    code, out, err = cli(capsys, monkeypatch, token, "ops", "suspend", run_id, "--reason", "again")
    assert code == 1 and out == "" and "409" in err and "run-suspended" in err
    requester = t.token("alice", Role.REQUESTER)
    code, _, err = cli(capsys, monkeypatch, requester, "ops", "resume", run_id, "--reason", "r")
    assert code == 1 and "403" in err

    code, out, err = cli(
        capsys, monkeypatch, token, "ops", "resume", run_id, "--reason", "over", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["suspended"] is False and t.run(run_id)["suspended"] is False


def test_the_rough_edges_a_new_user_met(t, env, capsys, monkeypatch) -> None:
    """Issue 34: ``runs submit`` needs no limits (the API does not), ``runs tail`` shows what a
    RunStateChanged changed, ``approvals`` alone lists, and piping into ``head`` is quiet."""
    t.publish()
    token = t.token("alice", Role.REQUESTER)
    code, out, err = cli(
        capsys, monkeypatch, token, "runs", "submit", "--workflow", t.workflow,
        "--model-profile", "code-agent", "--json",
    )  # fmt: skip
    assert code == 0, err
    run_id = json.loads(out)["runId"]
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")
    code, out, _ = cli(capsys, monkeypatch, token, "runs", "tail", run_id)
    changes = [line for line in out.splitlines() if "RunStateChanged" in line]
    assert changes and all(" -> " in line for line in changes), out
    assert any("Running -> Completed" in line for line in changes), out

    reviewer = t.token("rita", Role.REVIEWER)
    code, out, err = cli(capsys, monkeypatch, reviewer, "approvals")
    assert code == 0, err
    listed = cli(capsys, monkeypatch, reviewer, "approvals", "list")
    assert (code, out) == listed[:2]

    read, write = os.pipe()
    os.close(read)  # the reader (head) has gone
    try:
        ended = subprocess.run(
            [sys.executable, "-m", "runcontrol.cli", "runs", "list"],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, "RUNCONTROL_TOKEN": token},
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert b"Traceback" not in ended.stderr and b"BrokenPipe" not in ended.stderr, ended.stderr
    assert ended.returncode == 141
