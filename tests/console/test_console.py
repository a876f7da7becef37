"""The web console against the service as ``make run`` starts it, in headless Chromium.

Each test signs in as a person of the demo tenant (tokens printed by ``runcontrol up --dev`` or
minted by ``runcontrol token``), submits runs as any API client would, and checks what the
console shows and what the service then holds. "Live" means the page shows a change without
being loaded again (``Console.same_page``).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from console_harness import DEMO_RUN, Console, Service
from oauth_provider import ProviderServer

from runcontrol.api.console import ASSETS


def row_state(browser: Console, run_id: str) -> str | None:
    rows = browser.all(f'#runs tr[data-run-id="{run_id}"]')
    return rows[0].get_attribute("data-state") if rows else None


def run_state(browser: Console) -> str | None:
    found = browser.all("#run-state")
    return found[0].get_attribute("data-state") if found else None


def suspended(browser: Console) -> str | None:
    found = browser.all("#run-state")
    return found[0].get_attribute("data-suspended") if found else None


def pending_approval(service: Service, token: str, run_id: str) -> dict[str, Any]:
    page = service.get("/factory/approvals?state=Pending", token)
    (approval,) = [a for a in page["items"] if a["runId"] == run_id]
    return approval


def approve_over_api(service: Service, token: str, run_id: str) -> None:
    """The reviewer's decision, sent by another client than the browser."""
    approval = pending_approval(service, token, run_id)
    decided = httpx.post(
        f"{service.url}/factory/approvals/{approval['approvalId']}/decision",
        json={
            "decision": "approve",
            "version": approval["version"],
            "proposalHash": approval["proposalHash"],
        },
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert decided.status_code == 200, decided.text


def publish(service: Service, token: str, definition: dict[str, Any]) -> None:
    """A release, as a WorkspaceAdmin publishes it over the API."""
    published = httpx.post(
        f"{service.url}/factory/releases",
        json={"definition": definition},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert published.status_code == 201, published.text


def select(browser: Console, selector: str, value: str) -> None:
    from selenium.webdriver.support.select import Select

    Select(browser.css(selector)).select_by_value(value)


# ---------------------------------------------------------------------- the assets (no browser)


def test_console_is_served_without_a_token_and_keeps_to_its_origin(service: Service) -> None:
    with httpx.Client(base_url=service.url, timeout=60) as http:
        moved = http.get("/console")
        assert moved.status_code == 308
        assert moved.headers["location"].endswith("/console/")
        for path in ("/console/", *(f"/console/{name}" for name in ASSETS)):
            answer = http.get(path)
            assert answer.status_code == 200, path
            csp = answer.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        index = http.get("/console/").text
        assert 'src="console.js"' in index and "http" not in index.replace("http-equiv", "")
        # the provider's token endpoint is the one other origin the page may call
        token_url = http.get("/console/config.json").json()["oauth"]["tokenUrl"]
        origin = token_url.rsplit("/", 1)[0]
        assert (
            f"connect-src 'self' {origin}"
            in http.get("/console/").headers["content-security-policy"]
        )
        missing = http.get("/console/secrets.txt")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"
        assert missing.json()["code"] == "not-found"


# ---------------------------------------------------------------------- the pages


def test_runs_list_filters_and_a_run_moving_live(service: Service, browser: Console) -> None:
    alice, bob = service.printed["REQUESTER_TOKEN"], service.printed["REVIEWER_TOKEN"]
    browser.sign_in(alice)
    browser.mark_page()
    run_id = service.submit(alice)

    # The new run appears, then moves to WaitingForApproval, with no reload (the tenant feed).
    browser.wait(lambda: row_state(browser, run_id), "the submitted run in the list")
    browser.wait(
        lambda: row_state(browser, run_id) == "WaitingForApproval", "the run waiting for approval"
    )
    assert browser.same_page()
    assert "alice" in browser.text("#whoami", "who is signed in")
    browser.shot("runs")

    # Filters: state and workflow go to the API's query.
    select(browser, "#filter-state", "Completed")
    browser.wait(lambda: browser.css("#filter-state").get_attribute("value") == "Completed", "")
    browser.wait(lambda: row_state(browser, run_id) is None, "the filtered list without the run")
    select(browser, "#filter-state", "WaitingForApproval")
    browser.wait(lambda: row_state(browser, run_id), "the run under its state's filter")
    browser.css("#filter-workflow").send_keys("no-such-workflow\n")
    browser.wait(lambda: "No runs." in browser.css("#runs tbody").text, "an empty list")
    workflow = browser.css("#filter-workflow")  # the page was drawn again for the new filter
    workflow.clear()
    workflow.send_keys("demo-review\n")
    browser.wait(lambda: row_state(browser, run_id), "the run under its workflow's filter")

    # Open it: its steps, attempts and the lease of the attempt waiting for the approval.
    browser.click(f'#runs tr[data-run-id="{run_id}"] a.run-link')
    browser.wait(lambda: run_state(browser) == "WaitingForApproval", "the run page")
    assert browser.texts("#timeline > li > div > strong", "the steps") == [
        "1. plan",
        "2. apply",
        "3. report",
    ]
    browser.wait(
        lambda: browser.css("#timeline > li").get_attribute("data-state") == "Succeeded",
        "the first step succeeded",
    )
    # The apply attempt was leased, then parked for the approval (its lease released).
    apply = '#timeline > li:nth-child(2) li[data-attempt-id][data-state="Parked"]'
    browser.wait(lambda: browser.css(f'{apply} .lease[data-type="AttemptParked"]'), "parked")
    (granted,) = browser.texts(f'{apply} .lease[data-type="LeaseGranted"]', "the grant")
    assert "granted to demo-worker/worker-" in granted and "fencing token" in granted
    history = browser.attributes("#events tr[data-seq]", "data-type", "the run's events")
    assert history[-1] == "RunAccepted" and "ApprovalRequested" in history
    browser.shot("run")

    # The reviewer approves (over the API): the page follows the run to its end by itself.
    browser.mark_page()
    approve_over_api(service, bob, run_id)
    browser.wait(lambda: run_state(browser) == "Completed", "the run completed, live")
    browser.wait(
        lambda: browser.all('#events tr[data-type="RunCompleted"]'), "RunCompleted in the events"
    )
    assert browser.same_page()
    assert browser.text("#live", "the live marker") == "ended"
    # What each step streamed (the echo agents stream a line each), live, in order.
    browser.wait(lambda: "reporter:" in browser.css("#run-output").text, "the steps' output")
    lines = [line for line in browser.text("#run-output", "the output").splitlines() if ":" in line]
    assert [line.split(":")[0] for line in lines if not line.startswith("—")] == [
        "planner",
        "applier",
        "applier",  # parked for the approval, re-entered from the start once approved
        "reporter",
    ]
    assert (
        browser.attributes("#timeline > li", "data-state", "the steps' states") == ["Succeeded"] * 3
    )
    # Resumed by the decision, the apply attempt was leased again, under a newer fencing token.
    grants = browser.texts(
        '#timeline > li:nth-child(2) .lease[data-type="LeaseGranted"]', "the apply step's grants"
    )
    tokens = [int(g.rsplit("fencing token ", 1)[1]) for g in grants]
    assert len(tokens) == 2 and tokens[1] > tokens[0]
    # Its proposal was a journaled call: recorded once, its hash and size shown, not its content.
    (call,) = browser.texts('#timeline > li:nth-child(2) .calls li[data-call-name="proposal"]', "")
    assert call.startswith("journaled call proposal · sha256:") and " bytes · " in call
    browser.shot("run-completed")


def test_reviewer_approves_and_the_requester_is_refused(service: Service, browser: Console) -> None:
    # carol may review, but she requested this run: the server refuses her decision.
    carol = service.token("carol", "Requester,Reviewer")
    bob = service.printed["REVIEWER_TOKEN"]
    run_id = service.submit(carol)
    browser.sign_in(carol)
    browser.open("#/approvals")
    card_css = f'.approval[data-run-id="{run_id}"]'
    browser.wait(lambda: browser.css(card_css), "the run's approval request")
    expected = pending_approval(service, bob, run_id)
    shown = browser.wait(
        lambda: browser.css(f"{card_css} .proposal-hash").text, "the proposal hash"
    )
    assert shown == expected["proposalHash"]

    # The inbox redraws itself on live events: an action is retried on a redrawn card.
    browser.click(f"{card_css} button.approve")
    refusal = browser.text(
        f'{card_css} .problem[data-code="separation-of-duties"]', "the server's refusal"
    )
    # the server's own words, as its problem+json gives them
    assert refusal.startswith("403 Separation of duties (separation-of-duties): the requester")
    browser.shot("approvals-refused")
    assert pending_approval(service, bob, run_id)["state"] == "Pending"  # nothing changed

    browser.sign_in(bob)
    browser.open("#/approvals")
    browser.wait(lambda: browser.css(card_css), "the request in bob's inbox")
    browser.shot("approvals")

    def approve() -> bool:
        card = browser.css(card_css)
        reason = card.find_element("css selector", ".decision-reason")
        reason.clear()
        reason.send_keys("diff reviewed")
        card.find_element("css selector", "button.approve").click()
        return True

    browser.wait(approve, "bob's approval sent")
    browser.wait(lambda: not browser.all(card_css), "the request gone from the pending inbox")

    select(browser, "#filter-approval-state", "Approved")
    card = browser.text(card_css, "the request among the approved")
    assert "bob" in card and "diff reviewed" in card
    # (Following a run live is test_a_run_moves_live's; here the page shows where it ended.)
    browser.wait(
        lambda: service.get(f"/factory/runs/{run_id}", bob)["state"] == "Completed",
        "the approved run completed",
    )
    browser.open(f"#/runs/{run_id}")
    browser.wait(lambda: run_state(browser) == "Completed", "the run page showing Completed")
    approvals = service.get(f"/factory/approvals/{expected['approvalId']}", bob)
    assert (approvals["state"], approvals["decidedBy"]) == ("Approved", "bob")


def test_operator_cancels_a_run_with_a_reason(service: Service, browser: Console) -> None:
    alice = service.printed["REQUESTER_TOKEN"]
    run_id = service.submit(alice)
    browser.sign_in(service.token("olga", "Operator"))
    browser.open(f"#/runs/{run_id}")
    browser.wait(lambda: run_state(browser) == "WaitingForApproval", "the run waiting")

    browser.css("#cancel").click()  # no reason: nothing is sent
    browser.wait(lambda: "Give a reason" in browser.css("#control-result").text, "the hint")
    assert service.get(f"/factory/runs/{run_id}", alice)["state"] == "WaitingForApproval"

    browser.mark_page()
    browser.css("#control-reason").send_keys("wrong revision")
    browser.css("#cancel").click()
    browser.wait(lambda: run_state(browser) == "Cancelled", "the run cancelled, live")
    assert browser.same_page()
    run = service.get(f"/factory/runs/{run_id}", alice)
    assert run["state"] == "Cancelled"
    events = service.get(f"/factory/runs/{run_id}/events/history?limit=500", alice)
    requested = [e for e in events if e["type"] == "CancellationRequested"]
    assert requested and requested[0]["payload"].get("reason") == "wrong revision"


def test_sign_in_with_the_oauth2_provider_and_pkce(
    service: Service, browser: Console, oauth_provider: ProviderServer
) -> None:
    browser.open("#/login")
    browser.driver.execute_script("sessionStorage.clear()")
    browser.driver.refresh()
    (href,) = browser.attributes("#sign-in", "href", "the Sign in link")
    assert href.startswith(f"{oauth_provider.url}/authorize?")
    browser.shot("login")
    browser.click("#sign-in")
    browser.wait(lambda: browser.all("table#runs"), "the runs list after the provider's sign-in")
    assert browser.text("#whoami", "who is signed in").startswith("dana · Reviewer")
    assert "code=" not in browser.driver.current_url  # the one-time code left the address bar
    seen = oauth_provider.provider.seen
    authorize = [params for kind, params in seen if kind == "authorize"][-1]
    assert authorize["code_challenge_method"] == "S256"
    assert authorize["redirect_uri"] == f"{service.url}/console/"
    assert ("token", 200) in seen  # the provider checked the code verifier against it


def test_operator_suspends_resumes_and_reruns(service: Service, browser: Console) -> None:
    alice, bob = service.printed["REQUESTER_TOKEN"], service.printed["REVIEWER_TOKEN"]
    run_id = service.submit(alice)
    browser.sign_in(service.token("olga", "Operator"))
    browser.open(f"#/runs/{run_id}")
    browser.wait(lambda: run_state(browser) == "WaitingForApproval", "the run waiting")
    browser.mark_page()

    browser.css("#control-reason").send_keys("freeze for the audit")
    browser.css("#suspend").click()
    browser.wait(lambda: suspended(browser) == "true", "the run suspended")
    browser.shot("run-suspended")
    assert service.get(f"/factory/runs/{run_id}", alice)["suspended"] is True

    # Approved while suspended, the parked apply attempt is dispatched again, but no worker
    # gets a lease on it until the run is resumed.
    approve_over_api(service, bob, run_id)
    apply = '#timeline > li:nth-child(2) li[data-attempt-id][data-state="Dispatched"]'
    browser.wait(lambda: browser.css(f'{apply} .lease[data-type="AttemptResumed"]'), "resumed")

    browser.css("#resume").click()
    browser.wait(lambda: suspended(browser) == "false", "the run resumed")
    browser.wait(lambda: run_state(browser) == "Completed", "the resumed run completed")
    assert browser.same_page()
    history = service.get(f"/factory/runs/{run_id}/events/history?limit=500", alice)
    types = [e["type"] for e in history]
    suspended_at, resumed_at = types.index("RunSuspended"), types.index("RunResumed")
    assert suspended_at < types.index("AttemptResumed") < resumed_at
    assert "LeaseGranted" not in types[suspended_at:resumed_at]
    assert resumed_at < types.index("RunCompleted")

    # The finished run is rerun (the release it ran): a new run, linked back to this one.
    reason = browser.css("#control-reason")
    reason.clear()
    reason.send_keys("rerun after the audit")
    browser.css("#rerun").click()
    rerun_id = browser.text("#rerun-link", "the new run's link")
    assert rerun_id != run_id
    browser.click("#rerun-link")
    browser.wait(lambda: browser.css("#run-id").text == rerun_id, "the new run's page")
    assert service.get(f"/factory/runs/{rerun_id}", alice)["rerunOf"] == run_id
    browser.wait(lambda: browser.all(f'a[href="#/runs/{run_id}"]'), "the link to the rerun run")


def test_a_bad_token_is_refused_with_the_servers_reason(browser: Console) -> None:
    browser.open("#/login")
    browser.driver.execute_script("sessionStorage.clear()")
    browser.driver.refresh()
    browser.wait(lambda: browser.css("#token-input"), "the login form").send_keys("not.a.token")
    label = browser.text('label[for="token-input"]', "the token's label")
    assert "`" not in label and "runcontrol token" in label, label  # code, not backticks
    browser.css("#use-token").click()
    refusal = browser.text(".login .problem", "the refusal")
    assert refusal.startswith("the token is invalid")
    assert (
        browser.driver.execute_script("return sessionStorage.getItem('runcontrol.token')") is None
    )


def test_a_runs_page_draws_its_step_graph(service: Service, browser: Console) -> None:
    """Issue 22: a fan-out published over the catalog API; the run page draws each step as a
    node with its state (inline SVG, no library) and an edge per dependency."""
    admin = service.token("wanda", "WorkspaceAdmin")
    steps = [
        {"name": "plan", "agentId": "planner"},
        {"name": "left", "agentId": "reporter", "dependsOn": ["plan"]},
        {"name": "gate", "kind": "signal", "dependsOn": ["plan"]},
        {"name": "join", "agentId": "reporter", "dependsOn": ["left", "gate"]},
    ]
    published = httpx.post(
        f"{service.url}/factory/releases",
        json={"definition": {"workflowId": "demo-graph", "steps": steps}},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=60,
    )
    assert published.status_code == 201, published.text
    alice = service.printed["REQUESTER_TOKEN"]
    answer = httpx.post(
        f"{service.url}/factory/runs",
        json={**DEMO_RUN, "workflowId": "demo-graph"},
        headers={"Authorization": f"Bearer {alice}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=60,
    )
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["runId"]
    browser.sign_in(alice)
    browser.open(f"#/runs/{run_id}")
    browser.wait(
        lambda: browser.all('#graph g.node[data-step="gate"][data-state="Running"]'),
        "the signal step waiting in the graph",
    )
    nodes = browser.attributes("#graph g.node", "data-step", "the graph's nodes")
    assert nodes == ["plan", "left", "gate", "join"]
    assert len(browser.all("#graph line.edge")) == 4
    browser.shot("run-graph")


def test_the_queues_page_shows_a_held_run_and_its_release(
    service: Service, browser: Console
) -> None:
    """Issue 21: a workflow-wide concurrency key of limit 1; the second run on the same
    repository is held (the queue shows 1/1 holding, 1 waiting, the run page says why), and the
    first run's end releases it (the queue shows nobody waiting), live."""
    admin = service.token("wanda", "WorkspaceAdmin")
    workflow = f"demo-key-{uuid.uuid4().hex[:6]}"
    definition = {
        "workflowId": workflow,
        "concurrency": [{"key": "input.repository", "limit": 1}],
        "steps": [
            {"name": "plan", "agentId": "planner"},
            {"name": "go", "kind": "signal", "dependsOn": ["plan"]},
        ],
    }
    publish(service, admin, definition)
    alice = service.printed["REQUESTER_TOKEN"]
    repository = f"example/{uuid.uuid4().hex[:6]}"

    def submit() -> str:
        answer = httpx.post(
            f"{service.url}/factory/runs",
            json={**DEMO_RUN, "workflowId": workflow, "input": {"repository": repository}},
            headers={"Authorization": f"Bearer {alice}", "Idempotency-Key": str(uuid.uuid4())},
            timeout=60,
        )
        assert answer.status_code == 202, answer.text
        run_id: str = answer.json()["runId"]
        return run_id

    first, second = submit(), submit()
    browser.sign_in(alice)
    browser.open("#/queues")
    row = f'#queues tr[data-key="{repository}"]'
    browser.wait(
        lambda: browser.all(f'{row}[data-holders="1"][data-waiting="1"]'),
        "the key held by one run with one waiting",
    )
    browser.shot("queues-held")
    # the first column is the key's family (its name), not a limit
    assert browser.texts("#queues thead th", "the headers")[0] == "Name"
    browser.open(f"#/runs/{second}")
    browser.wait(
        lambda: [e for e in browser.all(".held") if f"concurrency-key {repository} 1/1" in e.text],
        "the held run saying why",
    )
    browser.open("#/queues")
    browser.wait(lambda: browser.all(f'{row}[data-waiting="1"]'), "the queue again")
    sent = httpx.post(
        f"{service.url}/factory/runs/{first}/signals/go",
        json={"ok": True},
        headers={"Authorization": f"Bearer {alice}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=60,
    )
    assert sent.status_code in (200, 202), sent.text
    browser.wait(
        lambda: browser.all(f'{row}[data-holders="1"][data-waiting="0"]'),
        "the first run's end releasing the second (live)",
    )
    assert service.get(f"/factory/runs/{first}", alice)["state"] == "Completed"
    assert service.get(f"/factory/runs/{second}", alice)["steps"][0]["held"] is None


def test_the_inbox_decides_the_selected_requests_in_one_call(
    service: Service, browser: Console
) -> None:
    alice = service.printed["REQUESTER_TOKEN"]
    bob = service.printed["REVIEWER_TOKEN"]
    runs = [service.submit(alice) for _ in range(2)]
    for run_id in runs:
        browser.wait(
            lambda run_id=run_id: any(
                a["runId"] == run_id
                for a in service.get("/factory/approvals?state=Pending", bob)["items"]
            ),
            "the run's approval request",
        )
    browser.sign_in(bob)
    browser.open("#/approvals")
    for run_id in runs:
        browser.click(f'.approval[data-run-id="{run_id}"] input.select-approval')
    browser.css("#bulk-reason").send_keys("batch reviewed")
    browser.click("#approve-selected")
    summary = browser.text("#bulk-result .notice", "the bulk call's outcome")
    assert summary == "2 decided"
    browser.shot("approvals-bulk")
    for run_id in runs:
        browser.wait(
            lambda run_id=run_id: not browser.all(f'.approval[data-run-id="{run_id}"]'), "decided"
        )
        (approval,) = service.get(f"/factory/runs/{run_id}/approvals", bob)["items"]
        assert (approval["state"], approval["decidedBy"], approval["reason"]) == (
            "Approved",
            "bob",
            "batch reviewed",
        )


def test_the_schedules_page_creates_pauses_triggers_and_deletes(
    service: Service, browser: Console
) -> None:
    alice = service.printed["REQUESTER_TOKEN"]
    browser.sign_in(alice)
    browser.open("#/schedules")
    browser.css("#new-workflow").send_keys("demo-review")
    browser.css("#new-profile").send_keys("code-agent")
    browser.css("#new-every").send_keys("3600")
    browser.click("#create-schedule")
    assert "created" in browser.text("#schedule-result .notice", "the new schedule")
    (schedule,) = [
        s for s in service.get("/factory/schedules", alice)["items"] if s["intervalSeconds"] == 3600
    ]
    row = f'#schedules tr[data-schedule-id="{schedule["scheduleId"]}"]'
    browser.wait(lambda: browser.css(row), "the schedule's row")
    browser.css("#schedule-note").send_keys("release freeze")
    browser.click(f"{row} button.pause")
    browser.wait(
        lambda: browser.css(row).get_attribute("data-paused") == "true", "the schedule paused"
    )
    assert "release freeze" in browser.text(row, "the paused schedule's row")
    browser.click(f"{row} button.trigger")
    assert browser.text("#schedule-result .notice", "the trigger's answer") == "fired: started"
    browser.shot("schedules")
    shown = service.get(f"/factory/schedules/{schedule['scheduleId']}", alice)
    assert shown["paused"] is True and shown["note"] == "release freeze"
    assert shown["lastFires"][0]["kind"] == "manual"
    browser.click(f"{row} button.delete")
    browser.wait(lambda: not browser.all(row), "the schedule's row gone")


def test_a_parent_and_its_child_run_link_to_each_other(service: Service, browser: Console) -> None:
    """Issue 32: a run step's child run; each run's page shows the other (the lineage)."""
    admin = service.token("wanda", "WorkspaceAdmin")
    suffix = uuid.uuid4().hex[:6]
    child_wf, parent_wf = f"child-{suffix}", f"parent-{suffix}"
    for definition in (
        {"workflowId": child_wf, "steps": [{"name": "go", "kind": "signal"}]},
        {
            "workflowId": parent_wf,
            "steps": [{"name": "delegate", "kind": "run", "workflowId": child_wf}],
        },
    ):
        publish(service, admin, definition)
    alice = service.printed["REQUESTER_TOKEN"]
    submitted = httpx.post(
        f"{service.url}/factory/runs",
        json=dict(DEMO_RUN, workflowId=parent_wf),
        headers={"Authorization": f"Bearer {alice}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=60,
    )
    assert submitted.status_code == 202, submitted.text
    parent = submitted.json()["runId"]
    browser.sign_in(alice)
    browser.open(f"#/runs/{parent}")
    child = browser.wait(
        lambda: [a.text for a in browser.all("#child-runs a")], "the parent's child run"
    )[0]
    assert browser.all(f'#timeline a.child-run[href="#/runs/{child}"]')
    browser.shot("run-parent")
    browser.click(f'#child-runs a[href="#/runs/{child}"]')
    browser.wait(lambda: browser.css("#run-id").text == child, "the child's page")
    assert browser.text("#parent-run", "the link to the parent") == parent
    assert service.get(f"/factory/runs/{child}", alice)["parentRunId"] == parent


def test_the_templates_page_decides_a_template_and_revokes_it(
    service: Service, browser: Console
) -> None:
    """Issue 44: a template proposed by carol is decided on its page, by the content hash
    shown there; carol (its author) is refused with the server's reason, bob approves and then
    revokes it, and the service holds what the page showed."""
    carol = service.token("carol", "Requester,Reviewer")
    bob = service.printed["REVIEWER_TOKEN"]
    template_id = f"nightly-{uuid.uuid4().hex[:6]}"
    proposed = httpx.post(
        f"{service.url}/factory/templates",
        json={
            "templateId": template_id,
            "workflowId": "demo-review",
            "preApprovals": [
                {
                    "actionClass": "shared-write",
                    "proposalWhen": "proposal.files <= 3",
                    "expiresAt": "2099-01-01T00:00:00+00:00",
                    "maxUses": 5,
                    "approverRole": "Reviewer",
                }
            ],
        },
        headers={"Authorization": f"Bearer {carol}"},
        timeout=60,
    )
    assert proposed.status_code == 201, proposed.text
    row = f'#templates tr[data-template-id="{template_id}"][data-version="1"]'

    browser.sign_in(carol)
    browser.open("#/templates")
    assert proposed.json()["contentHash"] in browser.text(row, "the proposed template's row")
    assert "shared-write or below" in browser.text(f"{row} .pre-approval", "its pre-approval")
    browser.click(f"{row} button.approve")
    refusal = browser.text(
        '#template-result .problem[data-code="separation-of-duties"]', "the author's refusal"
    )
    assert refusal.startswith("403")
    assert service.get(f"/factory/templates/{template_id}", bob)["state"] == "Proposed"

    browser.sign_in(bob)
    browser.open("#/templates")
    browser.click(f"{row} button.approve")
    browser.wait(
        lambda: browser.css(row).get_attribute("data-state") == "Active", "the template active"
    )
    browser.shot("templates")
    browser.css("#template-reason").send_keys("the freeze")
    browser.click(f"{row} button.revoke")
    browser.wait(
        lambda: browser.css(row).get_attribute("data-state") == "Revoked", "the template revoked"
    )
    shown = service.get(f"/factory/templates/{template_id}", bob)
    assert (shown["state"], shown["reason"]) == ("Revoked", "the freeze")


def test_a_replay_s_page_links_its_original_and_shows_its_report_live(
    service: Service, browser: Console
) -> None:
    """Issue 44: a replay's page names the run it replays and its options, and shows the
    divergence report beside it (docs/replay.md), redrawn as the replay moves: diverged while
    its step has not run, equal once it ends as the original did."""
    admin = service.token("wanda", "WorkspaceAdmin")
    olga = service.token("olga", "Operator")
    workflow = f"gate-{uuid.uuid4().hex[:6]}"
    definition = {"workflowId": workflow, "steps": [{"name": "go", "kind": "signal"}]}
    publish(service, admin, definition)
    alice = service.printed["REQUESTER_TOKEN"]

    def signal(run_id: str) -> None:
        sent = httpx.post(
            f"{service.url}/factory/runs/{run_id}/signals/go",
            json={"ok": True},
            headers={"Authorization": f"Bearer {alice}", "Idempotency-Key": str(uuid.uuid4())},
            timeout=60,
        )
        assert sent.status_code < 300, sent.text

    def completed(run_id: str) -> bool:
        return bool(service.get(f"/factory/runs/{run_id}", olga)["state"] == "Completed")

    original = service.submit(alice, dict(DEMO_RUN, workflowId=workflow))
    signal(original)
    browser.wait(lambda: completed(original), "the original completed")
    publish(service, admin, definition)  # release 2: what `latest` names now
    started = httpx.post(
        f"{service.url}/factory/runs/{original}/replays",
        json={"reason": "before moving latest", "releaseAlias": "latest"},
        headers={"Authorization": f"Bearer {olga}"},
        timeout=60,
    )
    assert started.status_code == 201, started.text
    replay = started.json()["runId"]

    browser.sign_in(olga)
    browser.open(f"#/runs/{replay}")
    assert browser.text("#replay-of", "the link to the original") == original
    verdict = "#replay-verdict"
    browser.wait(
        lambda: browser.css(verdict).get_attribute("data-diverged") == "true", "diverged so far"
    )
    assert browser.css('#replay-steps tr[data-step="go"]').get_attribute("data-equal") == "false"
    signal(replay)
    browser.wait(
        lambda: browser.css(verdict).get_attribute("data-diverged") == "false",
        "the report redrawn: equal",
    )
    browser.shot("run-replay")
    report = service.get(f"/factory/runs/{replay}/replay-report", olga)
    assert report["diverged"] is False and report["steps"][0]["equal"] is True
