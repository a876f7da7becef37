// The runcontrol web console: plain JavaScript, no build step, no third-party code.
//
// Every API call carries the bearer token (sessionStorage); the server decides what the
// token may do, and a refusal is shown as the server's problem+json says it. Event streams
// are read with fetch() rather than EventSource, which cannot send an Authorization header.

const TOKEN_KEY = "runcontrol.token";
const FEED_KEY = "runcontrol.feedPosition";
const PKCE_KEY = "runcontrol.pkce";
const RUN_STATES = ["Accepted", "Running", "WaitingForApproval", "Cancelling", "Completed", "Failed", "Cancelled"];
const APPROVAL_STATES = ["Pending", "Approved", "Rejected", "Expired", "Stale", "Cancelled"];
const TERMINAL_EVENTS = new Set(["RunCompleted", "RunFailed", "RunCancelled"]);
const REFRESH_MS = 250; // bursts of events (a replay, a busy run) become one reload

// ------------------------------------------------------------------ DOM

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const badge = (state) => h("span", { class: `state ${state}`, dataset: { state } }, state);
const short = (id) => (id ? String(id).slice(0, 8) : "");
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");

function problemBox(problem) {
  const code = problem.code ? ` (${problem.code})` : "";
  const text = `${problem.status} ${problem.title || "Error"}${code}: ${problem.detail || ""}`;
  return h("div", { class: "problem", role: "alert", dataset: { code: problem.code || "" } }, text);
}

function debounce(fn, ms) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
}

// ------------------------------------------------------------------ the API

class Problem extends Error {
  constructor(body) {
    super(body.detail || body.title);
    this.body = body;
  }
}

const token = () => sessionStorage.getItem(TOKEN_KEY);

function claims(jwt) {
  try {
    const part = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part));
  } catch {
    return {};
  }
}

async function problemOf(response) {
  try {
    const body = await response.json();
    if (body && typeof body === "object" && body.status) return body;
  } catch {
    // not JSON: say what HTTP said
  }
  return { status: response.status, title: response.statusText, detail: "" };
}

async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Authorization: `Bearer ${token()}`, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (response.status === 401) {
    const problem = await problemOf(response);
    signOut(problem.detail);
    throw new Problem(problem);
  }
  if (!response.ok) throw new Problem(await problemOf(response));
  return response.status === 204 ? null : response.json();
}

// Reads a text/event-stream with fetch: calls onEvent({id, event, data}) per frame and
// reconnects after the server's `retry` with Last-Event-ID, until the stream ends normally
// (a run's stream ends after its terminal event; 204: nothing will follow), or `signal` aborts.
async function follow(path, { after, signal, onEvent, onStatus = () => {} }) {
  let lastId = after;
  let retryMs = 2000;
  while (!signal.aborted) {
    try {
      const headers = { Authorization: `Bearer ${token()}`, Accept: "text/event-stream" };
      if (lastId !== undefined && lastId !== null) headers["Last-Event-ID"] = String(lastId);
      const response = await fetch(path, { headers, signal });
      if (response.status === 204) return;
      if (response.status === 401) {
        signOut((await problemOf(response)).detail);
        return;
      }
      if (!response.ok) throw new Problem(await problemOf(response));
      onStatus(true);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const parsed = { id: null, event: "message", data: "" };
          for (const line of frame.split("\n")) {
            const colon = line.indexOf(":");
            if (colon === 0) continue; // a comment: the heartbeat
            const field = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "id") parsed.id = text;
            else if (field === "event") parsed.event = text;
            else if (field === "data") parsed.data += (parsed.data ? "\n" : "") + text;
            else if (field === "retry" && /^\d+$/.test(text)) retryMs = Number(text);
          }
          if (!parsed.data) continue;
          if (parsed.id !== null) lastId = parsed.id;
          const ended = onEvent({ ...parsed, data: JSON.parse(parsed.data) });
          if (ended) return;
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof Problem && error.body.status < 500 && error.body.status !== 429) {
        onStatus(false, error.body);
        return;
      }
    }
    onStatus(false);
    await new Promise((resolve) => setTimeout(resolve, retryMs));
  }
}

// The tenant feed, for pages that list things: any event may change what they show.
function followFeed(signal, onChange, status) {
  follow("../factory/events", {
    after: Number(sessionStorage.getItem(FEED_KEY) || 0),
    signal,
    onStatus: (on) => status.classList.toggle("on", on),
    onEvent: (frame) => {
      sessionStorage.setItem(FEED_KEY, frame.id);
      onChange(frame.data);
      return false;
    },
  });
}

// ------------------------------------------------------------------ sign-in

let oauth = null;

function signOut(reason) {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(FEED_KEY);
  navigate(reason ? `#/login?reason=${encodeURIComponent(reason)}` : "#/login");
}

function useToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value.trim());
  sessionStorage.removeItem(FEED_KEY); // another token may see another tenant
}

const b64url = (bytes) =>
  btoa(String.fromCharCode(...new Uint8Array(bytes))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");

function randomString() {
  return b64url(crypto.getRandomValues(new Uint8Array(32)));
}

const redirectUri = () => location.origin + location.pathname;

// The authorization-code flow with PKCE (RFC 7636, S256): a public client, no secret.
async function authorizeUrl() {
  const verifier = randomString();
  const state = randomString();
  sessionStorage.setItem(PKCE_KEY, JSON.stringify({ verifier, state }));
  const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const url = new URL(oauth.authorizeUrl);
  url.search = new URLSearchParams({
    response_type: "code",
    client_id: oauth.clientId,
    redirect_uri: redirectUri(),
    scope: oauth.scope,
    state,
    code_challenge: challenge,
    code_challenge_method: "S256",
    ...(oauth.audience ? { audience: oauth.audience } : {}),
  });
  return url.toString();
}

// Back from the provider with ?code=&state=: trade the code for a token.
async function finishSignIn() {
  const params = new URLSearchParams(location.search);
  if (!params.has("code") && !params.has("error")) return null;
  const pending = JSON.parse(sessionStorage.getItem(PKCE_KEY) || "null");
  sessionStorage.removeItem(PKCE_KEY);
  history.replaceState(null, "", location.pathname + "#/runs");
  if (params.has("error")) return `the provider refused: ${params.get("error_description") || params.get("error")}`;
  if (!oauth || !pending || pending.state !== params.get("state")) return "the sign-in answer does not match a sign-in started here";
  const response = await fetch(oauth.tokenUrl, {
    method: "POST",
    headers: { "Content-Type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams({
      grant_type: "authorization_code",
      code: params.get("code"),
      redirect_uri: redirectUri(),
      client_id: oauth.clientId,
      code_verifier: pending.verifier,
    }),
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok || !body.access_token) return `the token endpoint answered ${response.status}: ${body.error_description || body.error || ""}`;
  useToken(body.access_token);
  return null;
}

async function loginPage(main, params) {
  const reason = params.get("reason");
  const problem = h("div");
  const input = h("textarea", { id: "token-input", rows: 5, placeholder: "eyJhbGciOi…", spellcheck: "false" });
  const submit = async (event) => {
    event.preventDefault();
    problem.replaceChildren();
    useToken(input.value);
    try {
      await api("../factory/runs?limit=1");
      navigate("#/runs");
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
    }
  };
  let signIn = null;
  if (oauth) {
    signIn = crypto.subtle
      ? h("a", { id: "sign-in", class: "button", href: await authorizeUrl() }, "Sign in")
      : h("span", { class: "problem" }, "Signing in with the provider needs https (PKCE uses the browser's crypto.subtle)");
  }
  main.replaceChildren(
    h("div", { class: "login" },
      h("h1", {}, "Sign in"),
      reason ? h("div", { class: "problem" }, reason) : null,
      signIn ? h("p", {}, signIn, " with the configured identity provider (OAuth2, PKCE), or paste a token below.") : null,
      h("form", { class: "card", onsubmit: submit },
        h("label", { class: "field", for: "token-input" }, "Bearer token (", h("code", {}, "runcontrol token …"), ", or what ", h("code", {}, "make run"), " prints)"),
        input,
        h("p", {}, h("button", { id: "use-token", type: "submit" }, "Use this token")),
        problem)));
}

// ------------------------------------------------------------------ runs

async function runsPage(main, params, signal) {
  const state = params.get("state") || "";
  const workflow = params.get("workflow") || "";
  const status = h("span", { class: "live", id: "live" }, "live");
  const freshness = h("span", { class: "muted", id: "as-of" });
  const body = h("tbody");
  const more = h("p");
  const problem = h("div");
  const go = () => {
    const q = new URLSearchParams();
    if (stateSelect.value) q.set("state", stateSelect.value);
    if (workflowInput.value.trim()) q.set("workflow", workflowInput.value.trim());
    location.hash = `#/runs?${q}`;
  };
  const stateSelect = h("select", { id: "filter-state", onchange: go },
    h("option", { value: "" }, "any"),
    RUN_STATES.map((s) => h("option", { value: s, selected: s === state }, s)));
  const workflowInput = h("input", { id: "filter-workflow", value: workflow, placeholder: "workflow id" });

  const row = (run) =>
    h("tr", { dataset: { runId: run.runId, state: run.state } },
      h("td", {}, h("a", { class: "mono run-link", href: `#/runs/${run.runId}` }, short(run.runId))),
      h("td", {}, run.workflowId),
      h("td", {}, badge(run.state), run.suspended ? [" ", badge("Suspended")] : null),
      h("td", {}, run.requestedBy),
      h("td", {}, run.projectId),
      h("td", {}, when(run.createdAt)),
      h("td", {}, when(run.updatedAt)));

  let pages = 1;
  const load = async () => {
    const q = new URLSearchParams({ limit: "50" });
    if (state) q.set("state", state);
    if (workflow) q.set("workflowId", workflow);
    const rows = [];
    let cursor = null;
    try {
      for (let page = 0; page < pages; page++) {
        if (cursor) q.set("cursor", cursor);
        const answer = await api(`../factory/runs?${q}`, { signal });
        if (page === 0) freshness.textContent = `as of ${new Date(answer.asOf).toLocaleTimeString()}`;
        rows.push(...answer.items);
        cursor = answer.nextCursor;
        if (!cursor) break;
      }
      problem.replaceChildren();
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
      return;
    }
    body.replaceChildren(...(rows.length ? rows.map(row) : [h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No runs."))]));
    more.replaceChildren(cursor ? h("button", { class: "secondary", onclick: () => { pages += 1; load(); } }, "Load more") : "");
  };

  main.replaceChildren(
    h("h1", {}, "Runs ", status),
    h("form", { class: "toolbar", id: "run-filters", onsubmit: (event) => { event.preventDefault(); go(); } },
      h("label", {}, "State", stateSelect),
      h("label", {}, "Workflow", workflowInput),
      h("button", { type: "submit", class: "secondary" }, "Filter"),
      freshness),
    problem,
    h("table", { id: "runs" },
      h("thead", {}, h("tr", {}, ["Run", "Workflow", "State", "Requested by", "Project", "Created", "Updated"].map((c) => h("th", {}, c)))),
      body),
    more);
  await load();
  followFeed(signal, debounce(load, REFRESH_MS), status);
}

// ------------------------------------------------------------------ one run

// What happened to each attempt's lease, from the run's events (the run itself shows only the
// current lease): granted (holder, fencing token), expired, parked for an approval, resumed.
const LEASE_EVENTS = new Set(["LeaseGranted", "LeaseExpired", "AttemptParked", "AttemptResumed"]);

function leaseLine(e) {
  const p = e.payload;
  const text = {
    LeaseGranted: () => [`lease ${short(p.leaseId)} granted to `, h("code", {}, p.holder), ` · fencing token ${p.fencingToken}`],
    LeaseExpired: () => [`lease ${short(p.leaseId)} expired`],
    AttemptParked: () => ["parked for an approval: lease released"],
    AttemptResumed: () => ["resumed: dispatched again"],
  }[e.type]();
  return h("div", { class: "lease", dataset: { type: e.type } }, when(e.occurredAt), " · ", ...text);
}

// ------------------------------------------------------------------ the step graph

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// The run's steps as a layered graph (no library): a step's column is the longest path from a
// root; an edge goes from each dependency to the step that waits for it.
function stepGraph(run) {
  const byName = new Map(run.steps.map((s, i) => [s.name, { step: s, deps: s.dependsOn ?? (i ? [run.steps[i - 1].name] : []) }]));
  const depth = new Map();
  const level = (name, seen = new Set()) => {
    if (depth.has(name)) return depth.get(name);
    if (seen.has(name)) return 0; // published graphs are acyclic; never loop on bad data
    seen.add(name);
    const deps = byName.get(name)?.deps ?? [];
    const d = deps.length ? 1 + Math.max(...deps.map((n) => level(n, seen))) : 0;
    depth.set(name, d);
    return d;
  };
  const columns = [];
  for (const name of byName.keys()) (columns[level(name)] ||= []).push(name);
  const W = 170, H = 52, GX = 60, GY = 18;
  const pos = new Map();
  columns.forEach((names, x) => names.forEach((name, y) => pos.set(name, { x: 10 + x * (W + GX), y: 10 + y * (H + GY) })));
  const width = 20 + columns.length * (W + GX) - GX;
  const height = 20 + Math.max(...columns.map((c) => c.length)) * (H + GY) - GY;
  const edges = [...byName.entries()].flatMap(([name, { deps }]) => deps.filter((d) => pos.has(d)).map((d) => {
    const a = pos.get(d), b = pos.get(name);
    return svg("line", { x1: a.x + W, y1: a.y + H / 2, x2: b.x, y2: b.y + H / 2, class: "edge", "marker-end": "url(#arrow)" });
  }));
  const nodes = [...byName.entries()].map(([name, { step }]) => {
    const { x, y } = pos.get(name);
    const attempts = step.attempts.length ? ` · ${step.attempts.length} attempt${step.attempts.length > 1 ? "s" : ""}` : "";
    const kind = step.kind && step.kind !== "agent" ? `${step.kind} · ` : "";
    return svg("g", { class: `node ${step.state}`, "data-step": name, "data-state": step.state },
      svg("rect", { x, y, width: W, height: H, rx: 6 }),
      svg("text", { x: x + 8, y: y + 20, class: "name" }, name),
      svg("text", { x: x + 8, y: y + 40, class: "muted" }, `${kind}${step.state}${attempts}`));
  });
  return svg("svg", { class: "graph", id: "graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "the run's step graph" },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 8, markerHeight: 8, orient: "auto" }, svg("path", { d: "M0,0 L10,5 L0,10 z" }))),
    edges, nodes);
}

function waitLine(step) {
  if (!step.kind || step.kind === "agent") return null;
  if (step.kind === "run") {
    const child = step.child ? [" · child ", h("a", { class: "mono child-run", href: `#/runs/${step.child.runId}` }, short(step.child.runId)), ` (#${step.child.number})`] : null;
    return h("span", { class: "muted" }, ` · runs workflow ${step.wait?.workflowId}`, child, " · no worker");
  }
  const what = step.kind === "signal" ? `waits for signal ${step.wait?.signal}` : `waits ${step.wait?.seconds ?? ""}${step.wait?.seconds !== undefined ? " s" : `until ${when(step.wait?.until)}`}`;
  return h("span", { class: "muted" }, ` · ${what}${step.dueAt ? ` · until ${when(step.dueAt)}` : ""} · no worker`);
}

function timeline(run, attemptEvents) {
  return h("ol", { class: "timeline", id: "timeline" },
    run.steps.map((step) =>
      h("li", { class: step.state, dataset: { stepId: step.stepId, state: step.state } },
        h("div", {},
          h("strong", {}, `${step.ordinal}. ${step.name}`), " ", badge(step.state),
          step.kind && step.kind !== "agent"
            ? waitLine(step)
            : h("span", { class: "muted" }, ` agent ${step.agentId} · ${step.sideEffectClass} · gate ${step.gate} · up to ${step.maxAttempts} attempts`),
          step.dependsOn && step.dependsOn.length ? h("span", { class: "muted" }, ` · after ${step.dependsOn.join(", ")}`) : null,
          step.condition ? h("span", { class: "muted" }, ` · when ${step.condition}`) : null,
          step.notBefore ? h("span", { class: "muted" }, ` · not before ${when(step.notBefore)}`) : null,
          step.held ? h("span", { class: "held" }, ` · held: ${step.heldReason || `${step.held.kind} ${step.held.bucket || step.held.key || ""}`}`) : null),
        h("ul", { class: "attempts" },
          step.attempts.map((a) =>
            h("li", { dataset: { attemptId: a.attemptId, state: a.state } },
              `attempt ${a.number} `, badge(a.state),
              h("span", { class: "muted" }, ` dispatched ${when(a.dispatchedAt)}`),
              a.settledAt ? h("span", { class: "muted" }, ` · settled ${when(a.settledAt)}`) : null,
              a.outcome ? h("span", {}, ` · outcome ${a.outcome}`) : null,
              a.failureClass ? h("span", {}, ` (${a.failureClass})`) : null,
              (attemptEvents.get(a.attemptId) || []).map(leaseLine),
              a.lease
                ? h("div", { class: "lease current" },
                    `now held by `, h("code", {}, a.lease.holder),
                    ` · lease ${short(a.lease.leaseId)} · fencing token ${a.lease.fencingToken} · expires ${when(a.lease.expiresAt)}`)
                : null))),
        step.calls && step.calls.length
          ? h("ul", { class: "calls" },
              step.calls.map((c) =>
                h("li", { dataset: { callName: c.name, occurrence: c.occurrence } },
                  `journaled call `, h("code", {}, c.occurrence > 1 ? `${c.name} #${c.occurrence}` : c.name),
                  c.failed ? h("span", { class: "held" }, " failed") : null,
                  " · ", h("span", { class: "hash" }, c.valueHash),
                  h("span", { class: "muted" }, ` · ${c.bytes} bytes · ${when(c.recordedAt)}`))))
          : null)));
}

function eventRow(e) {
  const payload = JSON.stringify(e.payload);
  return h("tr", { dataset: { seq: e.seq, type: e.type } },
    h("td", { class: "mono" }, e.seq),
    h("td", {}, when(e.occurredAt)),
    h("td", {}, e.type),
    h("td", { class: "mono" }, short(e.stepId)),
    h("td", { class: "mono" }, short(e.attemptId)),
    h("td", { class: "payload mono" }, payload.length > 300 ? `${payload.slice(0, 300)}…` : payload));
}

// The operator's controls (suspend, resume, cancel, retry, resolve, rerun): each sends the
// run's command with a reason. Which buttons are enabled follows the run as shown; the server
// decides, and its refusal is shown as it gives it.
const RETRY_AFTER = new Set(["Failed", "TimedOut", "Uncertain"]);
const TERMINAL_RUN = new Set(["Completed", "Failed", "Cancelled"]);

// The inputs and the last answer outlive the redraws the run's events cause.
function controlInputs() {
  return {
    out: h("div", { id: "control-result" }),
    reason: h("input", { id: "control-reason", placeholder: "why (required, audited)", size: 40 }),
    release: h("select", { id: "rerun-release" },
      h("option", { value: "pinned" }, "the release it ran"),
      h("option", { value: "current" }, "the current release")),
  };
}

function controls(run, reload, { out, reason, release }) {
  const send = (path, extra = () => ({})) => async () => {
    out.replaceChildren();
    if (!reason.value.trim()) {
      out.replaceChildren(h("div", { class: "problem" }, "Give a reason: every control is recorded with one."));
      return;
    }
    try {
      const answer = await api(`../factory/runs/${run.runId}/${path}`, { method: "POST", body: { reason: reason.value.trim(), ...extra() } });
      const what = path.split("/").pop();
      out.replaceChildren(
        answer && answer.rerunOf
          ? h("div", { class: "notice" }, "rerun: new run ", h("a", { class: "mono", id: "rerun-link", href: `#/runs/${answer.runId}` }, answer.runId))
          : h("div", { class: "notice" }, `${what}: done${answer && answer.state ? ` (run ${answer.state}${answer.suspended ? ", suspended" : ""})` : ""}`));
      reload();
    } catch (error) {
      if (error instanceof Problem) out.replaceChildren(problemBox(error.body));
    }
  };
  const ended = TERMINAL_RUN.has(run.state);
  const retry = run.steps
    .filter((s) => !["Succeeded", "Failed", "Cancelled", "Skipped"].includes(s.state) && s.attempts.length && RETRY_AFTER.has(s.attempts[s.attempts.length - 1].state))
    .map((s) => h("button", { class: "secondary retry", dataset: { stepId: s.stepId }, onclick: send(`steps/${s.stepId}/retry`) }, `Retry ${s.name} now`));
  const resolve = run.steps.flatMap((s) =>
    s.attempts.filter((a) => a.state === "Uncertain").map((a) => {
      const outcome = h("select", {}, ["Succeeded", "Failed"].map((o) => h("option", { value: o }, o)));
      return h("div", { class: "row resolve", dataset: { attemptId: a.attemptId } },
        `${s.name}, attempt ${a.number} is Uncertain: resolve as `, outcome,
        h("button", { class: "secondary", onclick: send(`attempts/${a.attemptId}/resolve`, () => ({ outcome: outcome.value })) }, "Resolve"));
    }));
  return h("div", { class: "card controls", id: "controls" },
    h("div", { class: "row" },
      h("label", { class: "field" }, "Reason", reason),
      h("button", { id: "suspend", class: "secondary", disabled: ended || run.suspended, onclick: send("suspend") }, "Suspend"),
      h("button", { id: "resume", class: "secondary", disabled: ended || run.suspended === false, onclick: send("resume") }, "Resume"),
      h("button", { id: "cancel", class: "danger", disabled: ended, onclick: send("cancel") }, "Cancel run"),
      h("label", { class: "field" }, "Rerun with", release),
      h("button", { id: "rerun", class: "secondary", disabled: !ended, onclick: send("rerun", () => ({ release: release.value })) }, "Rerun")),
    retry.length ? h("div", { class: "row" }, retry) : null,
    resolve,
    out);
}

async function runPage(main, runId, signal) {
  const status = h("span", { class: "live", id: "live" }, "live");
  const head = h("div");
  const problem = h("div");
  const steps = h("div");
  const approvals = h("div");
  const replay = h("div", { id: "replay-report" });
  const control = h("div");
  const events = h("tbody");
  const inputs = controlInputs();
  const attemptEvents = new Map(); // attemptId -> its lease events, in seq order
  let shown = null; // the run as last read
  let lastSeq = 0;
  const drawTimeline = () => {
    if (shown) steps.replaceChildren(
      h("h2", {}, "Step graph"), h("div", { class: "card graph-box" }, stepGraph(shown)),
      h("h2", {}, "Steps, attempts and leases"), timeline(shown, attemptEvents));
  };

  const load = async () => {
    let run;
    try {
      run = await api(`../factory/runs/${runId}`, { signal });
      problem.replaceChildren();
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
      return null;
    }
    head.replaceChildren(
      h("h1", {}, "Run ", h("span", { class: "mono", id: "run-id" }, run.runId), " ",
        h("span", { id: "run-state", dataset: { state: run.state, suspended: String(Boolean(run.suspended)) } },
          badge(run.state), run.suspended ? [" ", badge("Suspended")] : null),
        " ", status),
      h("dl", { class: "facts card" },
        h("dt", {}, "Workflow"), h("dd", {}, `${run.workflowId} · release ${run.releaseId} · policy ${run.policyRevision}`),
        h("dt", {}, "Requested by"), h("dd", {}, `${run.requestedBy} · project ${run.projectId}`),
        run.rerunOf ? [h("dt", {}, "Rerun of"), h("dd", {}, h("a", { class: "mono", href: `#/runs/${run.rerunOf}` }, run.rerunOf))] : null,
        run.replayOf ? [h("dt", {}, "Replay of"), h("dd", {}, h("a", { class: "mono", id: "replay-of", href: `#/runs/${run.replayOf}` }, run.replayOf),
          ` · calls ${run.replay && run.replay.liveCalls ? "made live when new" : "refused when new"} · changed approvals ${run.replay ? run.replay.approvals : ""} · never production`)] : null,
        run.parentRunId ? [h("dt", {}, "Parent run"), h("dd", {}, h("a", { class: "mono", id: "parent-run", href: `#/runs/${run.parentRunId}` }, run.parentRunId), ` · step ${short(run.parentStepId)} · depth ${run.depth}`)] : null,
        run.children && run.children.length ? [h("dt", {}, "Child runs"), h("dd", { id: "child-runs" },
          run.children.map((c) => h("div", {}, h("a", { class: "mono", href: `#/runs/${c.runId}` }, c.runId), ` · ${c.workflowId} · `, badge(c.state))))] : null,
        run.suspended ? [h("dt", {}, "Suspended"), h("dd", {}, `since ${when(run.suspendedAt)}: nothing new starts until resumed`)] : null,
        h("dt", {}, "Model profile"), h("dd", {}, run.modelProfileId),
        h("dt", {}, "Limits"), h("dd", {}, `cost ${run.limits.maxCostUsd ?? "-"} USD · ${run.limits.maxMinutes ?? "-"} min`),
        h("dt", {}, "Created / updated"), h("dd", {}, `${when(run.createdAt)} / ${when(run.updatedAt)} · version ${run.version}`),
        run.failureClass ? [h("dt", {}, "Failure"), h("dd", {}, `${run.failureClass}: ${run.failureReason || ""}`)] : null,
        run.resultHash ? [h("dt", {}, "Result"), h("dd", {},
          h("span", { class: "hash", id: "result-hash" }, run.resultHash), ` · ${run.resultBytes} bytes`,
          h("pre", { class: "mono", id: "run-result" },
            JSON.stringify(run.resultRef ?? run.result, null, 2) ?? "(kept no longer: past the event history's retention)"))] : null));
    shown = run;
    drawTimeline();
    if (run.replayOf) drawReplayReport(replay, runId, signal);
    approvals.replaceChildren(
      ...(run.pendingApprovals.length
        ? [h("h2", {}, "Pending approvals"),
           ...run.pendingApprovals.map((a) => h("p", { class: "card" }, `${a.actionClass} on step ${short(a.stepId)}: proposal `, h("span", { class: "hash" }, a.proposalHash), " — ", h("a", { href: "#/approvals" }, "decide in the inbox")))]
        : []));
    control.replaceChildren(h("h2", {}, "Operator controls"), controls(run, reloadSoon, inputs));
    return run;
  };
  const reloadSoon = debounce(load, REFRESH_MS);

  const addEvent = (e) => {
    if (e.seq <= lastSeq) return;
    lastSeq = e.seq;
    events.prepend(eventRow(e));
    const attemptId = e.attemptId || e.payload.attemptId;
    if (attemptId && LEASE_EVENTS.has(e.type)) {
      attemptEvents.set(attemptId, [...(attemptEvents.get(attemptId) || []), e]);
    }
  };

  // The steps' streamed output (docs/streaming.md), live from position 0: text as written, a
  // JSON chunk on a line of its own, a marker where another attempt's output begins.
  const output = h("pre", { class: "mono output", id: "run-output" });
  let outputAttempt = null;
  const addOutput = (c) => {
    if (c.attemptId !== outputAttempt) {
      outputAttempt = c.attemptId;
      output.append(h("span", { class: "output-mark" }, `— step ${short(c.stepId)} · attempt ${short(c.attemptId)} —\n`));
    }
    output.append(c.text !== undefined ? c.text : `${JSON.stringify(c.data)}\n`);
  };

  main.replaceChildren(
    problem, head, approvals, replay, steps, control,
    h("h2", {}, "Output"), output,
    h("h2", {}, "Events"),
    h("table", { class: "events", id: "events" },
      h("thead", {}, h("tr", {}, ["Seq", "When", "Type", "Step", "Attempt", "Payload"].map((c) => h("th", {}, c)))),
      events));
  if (!(await load())) return;
  try {
    for (;;) {
      const page = await api(`../factory/runs/${runId}/events/history?after=${lastSeq}&limit=500`, { signal });
      page.forEach(addEvent);
      if (page.length < 500) break;
    }
  } catch (error) {
    if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
    return;
  }
  drawTimeline();
  follow(`../factory/runs/${runId}/output/stream`, {
    after: 0,
    signal,
    onEvent: (frame) => { addOutput(frame.data); return false; },
  });
  follow(`../factory/runs/${runId}/events`, {
    after: lastSeq,
    signal,
    onStatus: (on) => status.classList.toggle("on", on),
    onEvent: (frame) => {
      addEvent(frame.data);
      reloadSoon();
      if (TERMINAL_EVENTS.has(frame.data.type)) {
        status.classList.remove("on");
        status.textContent = "ended";
        return true;
      }
      return false;
    },
  });
}

// ------------------------------------------------------------------ a replay's report

// docs/replay.md: per step equal or not (both outcome hashes, a diff of small results), the
// calls made that the original did not make, the original's calls not made, changed proposals.
async function drawReplayReport(box, runId, signal) {
  let report;
  try {
    report = await api(`../factory/runs/${runId}/replay-report`, { signal });
  } catch (error) {
    if (error instanceof Problem) box.replaceChildren(problemBox(error.body));
    return;
  }
  const calls = (title, id, list) => (list.length
    ? [h("h3", {}, title), h("ul", { id }, list.map((c) => h("li", { class: "mono" }, `${c.step} · ${c.name} #${c.occurrence}`)))]
    : []);
  box.replaceChildren(
    h("h2", {}, "Replay report ", h("span", { id: "replay-verdict", dataset: { diverged: String(report.diverged) } }, badge(report.diverged ? "Diverged" : "Equal"))),
    h("table", { id: "replay-steps" },
      h("thead", {}, h("tr", {}, ["Step", "", "Original outcome", "Replay outcome", "Difference"].map((c) => h("th", {}, c)))),
      h("tbody", {}, report.steps.map((st) => h("tr", { dataset: { step: st.step, equal: String(st.equal) } },
        h("td", {}, st.step),
        h("td", {}, st.equal ? "equal" : (st.replayFailureClass || "different")),
        h("td", { class: "hash" }, st.originalHash || "-"),
        h("td", { class: "hash" }, st.replayHash || "-"),
        h("td", {}, (st.diff || []).map((d) => h("div", { class: "mono" }, `${d.path}: ${JSON.stringify(d.before)} → ${JSON.stringify(d.after)}`))))))),
    ...calls("Calls the original did not make", "replay-calls-new", report.callsNotInOriginal),
    ...calls("Calls of the original not made", "replay-calls-missing", report.originalCallsNotMade),
    ...(report.approvalsChanged.length
      ? [h("h3", {}, "Approvals whose proposal changed"), h("ul", { id: "replay-approvals" }, report.approvalsChanged.map((a) => h("li", {}, `${a.step}: `, h("span", { class: "hash" }, a.proposalHash))))]
      : []));
}

// ------------------------------------------------------------------ approvals

async function approvalsPage(main, params, signal) {
  const state = params.get("state") || "Pending";
  const status = h("span", { class: "live", id: "live" }, "live");
  const list = h("div", { id: "approvals" });
  const problem = h("div");
  const stateSelect = h("select", { id: "filter-approval-state", onchange: () => { location.hash = `#/approvals?state=${stateSelect.value}`; } },
    APPROVAL_STATES.map((s) => h("option", { value: s, selected: s === state }, s)));
  // approvalId -> the last answer shown on its card / the reason typed: kept across reloads
  const results = new Map();
  const reasons = new Map();
  // approvalId -> the request as shown, for the ones ticked (decided together in one call)
  const selected = new Map();
  let shown = [];
  const bulkReason = h("input", { id: "bulk-reason", placeholder: "reason (optional)" });
  const bulkResult = h("div", { id: "bulk-result" });
  const decideSelected = (decision) => async () => {
    bulkResult.replaceChildren();
    if (!selected.size) {
      bulkResult.replaceChildren(h("p", { class: "muted" }, "Select requests first."));
      return;
    }
    const reason = bulkReason.value.trim();
    const items = [...selected.values()].map((a) => ({ approvalId: a.approvalId, decision, version: a.version, proposalHash: a.proposalHash, ...(reason ? { reason } : {}) }));
    try {
      const answer = await api("../factory/approvals/decisions", { method: "POST", body: { items } });
      for (const item of answer.items) {
        results.set(item.approvalId, item.outcome === "decided"
          ? h("div", { class: "notice" }, `${item.approval.state} by ${item.approval.decidedBy}`)
          : h("div", { class: "problem", dataset: { code: item.code, outcome: item.outcome } }, `${item.outcome}: ${item.status} (${item.code}): ${item.detail}`));
      }
      const counts = Object.entries(answer.counts).filter(([, n]) => n).map(([o, n]) => `${n} ${o}`).join(", ");
      bulkResult.replaceChildren(h("div", { class: "notice", dataset: { counts: JSON.stringify(answer.counts) } }, counts));
      selected.clear();
    } catch (error) {
      if (!(error instanceof Problem)) throw error;
      bulkResult.replaceChildren(problemBox(error.body));
    }
    await load();
  };

  const card = (a) => {
    const reason = h("input", { class: "decision-reason", placeholder: "reason (optional)", value: reasons.get(a.approvalId), oninput: () => reasons.set(a.approvalId, reason.value) });
    const result = h("div", { class: "decision-result" }, results.get(a.approvalId) || null);
    const decide = (decision) => async () => {
      result.replaceChildren();
      try {
        const answer = await api(`../factory/approvals/${a.approvalId}/decision`, {
          method: "POST",
          body: { decision, version: a.version, proposalHash: a.proposalHash, ...(reason.value.trim() ? { reason: reason.value.trim() } : {}) },
        });
        results.set(a.approvalId, h("div", { class: "notice" }, `${answer.state} by ${answer.decidedBy}`));
      } catch (error) {
        if (!(error instanceof Problem)) throw error;
        results.set(a.approvalId, problemBox(error.body));
      }
      result.replaceChildren(results.get(a.approvalId));
      reloadSoon();
    };
    const pending = a.state === "Pending";
    const tick = pending
      ? h("input", { type: "checkbox", class: "select-approval", checked: selected.has(a.approvalId), onchange: (e) => { if (e.target.checked) selected.set(a.approvalId, a); else selected.delete(a.approvalId); } })
      : null;
    return h("div", { class: "card approval", dataset: { approvalId: a.approvalId, runId: a.runId, state: a.state } },
      h("h3", {}, tick, `${a.actionClass} `, badge(a.state)),
      h("dl", { class: "facts" },
        h("dt", {}, "Proposal hash"), h("dd", {}, h("span", { class: "hash proposal-hash" }, a.proposalHash)),
        h("dt", {}, "Run"), h("dd", {}, h("a", { class: "mono", href: `#/runs/${a.runId}` }, a.runId), ` · step ${short(a.stepId)} · attempt ${short(a.attemptId)}`),
        h("dt", {}, "Requested by"), h("dd", {}, a.requestedBy),
        h("dt", {}, "Approver rule"), h("dd", {}, `${a.approverRule} · ${a.requiredApprovals} approval(s) · policy ${a.policyRevision}`),
        h("dt", {}, "Version"), h("dd", {}, a.version),
        h("dt", {}, pending ? "Expires" : "Decided"),
        h("dd", {}, pending ? when(a.expiresAt) : `${a.decidedBy || "-"} ${when(a.decidedAt)} ${a.reason ? `· ${a.reason}` : ""}`)),
      pending
        ? h("div", { class: "actions" },
            h("label", { class: "field" }, "Reason", reason),
            h("button", { class: "approve", onclick: decide("approve") }, "Approve"),
            h("button", { class: "reject danger", onclick: decide("reject") }, "Reject"),
            h("button", { class: "request-changes secondary", onclick: decide("request-changes") }, "Request changes"))
        : null,
      result);
  };

  const load = async () => {
    try {
      const answer = await api(`../factory/approvals?state=${state}&limit=100`, { signal });
      problem.replaceChildren();
      shown = answer.items;
      list.replaceChildren(...(answer.items.length ? answer.items.map(card) : [h("p", { class: "muted" }, `No ${state.toLowerCase()} approval requests.`)]));
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
    }
  };
  const reloadSoon = debounce(load, REFRESH_MS);

  main.replaceChildren(
    h("h1", {}, "Approvals ", status),
    h("div", { class: "toolbar" }, h("label", {}, "State", stateSelect)),
    state === "Pending"
      ? h("div", { class: "toolbar", id: "bulk" },
          h("button", { id: "select-all", class: "secondary", onclick: () => { for (const a of shown) if (a.state === "Pending") selected.set(a.approvalId, a); list.replaceChildren(...shown.map(card)); } }, "Select all"),
          h("label", { class: "field" }, "Reason", bulkReason),
          h("button", { id: "approve-selected", onclick: decideSelected("approve") }, "Approve selected"),
          h("button", { id: "reject-selected", class: "danger", onclick: decideSelected("reject") }, "Reject selected"))
      : null,
    bulkResult, problem, list);
  await load();
  followFeed(signal, (event) => {
    if (event.type.startsWith("Approval")) reloadSoon();
  }, status);
}

// ------------------------------------------------------------------ queues (flow control)

const age = (seconds) => (seconds == null ? "" : seconds < 90 ? `${Math.round(seconds)} s` : `${Math.round(seconds / 60)} min`);

async function queuesPage(main, signal) {
  const status = h("span", { class: "live", id: "live" }, "live");
  const freshness = h("span", { class: "muted", id: "as-of" });
  const body = h("tbody");
  const problem = h("div");
  const row = (item) =>
    h("tr", { dataset: { kind: item.kind, key: item.key, waiting: item.waiting, holders: item.holders } },
      h("td", {}, item.kind === "capacity" ? "open attempts (tenant cap)" : item.name || ""),
      h("td", { class: "mono" }, item.key),
      h("td", {}, `${item.holders}/${item.limit}`),
      h("td", {}, item.promoted),
      h("td", {}, item.waiting),
      h("td", {}, age(item.oldestWaitingSeconds)));
  const load = async () => {
    try {
      const answer = await api("../factory/queues", { signal });
      freshness.textContent = `as of ${new Date(answer.asOf).toLocaleTimeString()}`;
      problem.replaceChildren();
      body.replaceChildren(...(answer.items.length ? answer.items.map(row) : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No key has holders or waiting runs."))]));
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
    }
  };
  main.replaceChildren(
    h("h1", {}, "Queues ", status),
    h("p", { class: "muted" }, "Concurrency keys and the tenant's cap with holders or held runs, busiest first. A held run says why on its page. ", freshness),
    problem,
    h("table", { id: "queues" },
      h("thead", {}, h("tr", {}, ["Name", "Key", "Holders", "Promoted", "Waiting", "Oldest waiting"].map((c) => h("th", {}, c)))),
      body));
  await load();
  followFeed(signal, debounce(load, REFRESH_MS), status);
}

// ------------------------------------------------------------------ schedules

async function schedulesPage(main, signal) {
  const body = h("tbody");
  const problem = h("div");
  const result = h("div", { id: "schedule-result" });
  const note = h("input", { id: "schedule-note", placeholder: "note (pause/resume)" });
  const show = (error) => { if (error instanceof Problem) result.replaceChildren(problemBox(error.body)); else throw error; };
  const act = (fn) => async () => { result.replaceChildren(); try { await fn(); await load(); } catch (error) { show(error); } };
  const row = (s) => {
    const url = `../factory/schedules/${s.scheduleId}`;
    const pause = () => api(url, { method: "PATCH", body: { paused: !s.paused, ...(note.value.trim() ? { note: note.value.trim() } : {}) } });
    return h("tr", { dataset: { scheduleId: s.scheduleId, paused: String(s.paused) } },
      h("td", { class: "mono" }, short(s.scheduleId)),
      h("td", {}, `${s.run.workflowId}@${s.run.releaseAlias || "latest"}`),
      h("td", { class: "mono" }, s.cron ? `${s.cron} (${s.timeZone})` : `every ${s.intervalSeconds} s`),
      h("td", {}, s.overlap),
      h("td", {}, s.paused ? `paused${s.note ? `: ${s.note}` : ""}` : when(s.nextFireAt)),
      h("td", { class: "counts" }, `${s.started} started · ${s.skipped} skipped · ${s.missed} missed`),
      h("td", {},
        h("button", { class: "pause secondary", onclick: act(pause) }, s.paused ? "Resume" : "Pause"),
        h("button", { class: "trigger secondary", onclick: act(async () => { const a = await api(`${url}/trigger`, { method: "POST" }); result.replaceChildren(h("div", { class: "notice" }, `fired: ${a.outcome}`)); }) }, "Trigger now"),
        h("button", { class: "delete danger", onclick: act(() => api(url, { method: "DELETE" })) }, "Delete")));
  };
  const field = (id, label, value = "") => h("label", { class: "field" }, label, h("input", { id, value }));
  const create = act(async () => {
    const v = (id) => document.getElementById(id).value.trim();
    const every = v("new-every");
    const created = await api("../factory/schedules", {
      method: "POST",
      body: {
        run: { workflowId: v("new-workflow"), releaseAlias: v("new-alias") || "latest", modelProfileId: v("new-profile"), input: JSON.parse(v("new-input") || "{}") },
        ...(every ? { intervalSeconds: Number(every) } : { cron: v("new-cron") }),
        timeZone: v("new-zone") || "UTC",
        overlap: document.getElementById("new-overlap").value,
      },
    });
    result.replaceChildren(h("div", { class: "notice" }, `schedule ${short(created.scheduleId)} created; next ${when(created.nextFireAt)}`));
  });
  const load = async () => {
    try {
      const answer = await api("../factory/schedules?limit=200", { signal });
      problem.replaceChildren();
      body.replaceChildren(...(answer.items.length ? answer.items.map(row) : [h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No schedules."))]));
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
    }
  };
  main.replaceChildren(
    h("h1", {}, "Schedules"),
    h("div", { class: "toolbar", id: "new-schedule" },
      field("new-workflow", "Workflow"), field("new-alias", "Alias", "latest"), field("new-profile", "Model profile"),
      field("new-input", "Input (JSON)", "{}"), field("new-cron", "Cron", "0 3 * * *"), field("new-zone", "Time zone", "UTC"),
      field("new-every", "or every (s)"),
      h("label", { class: "field" }, "Overlap", h("select", { id: "new-overlap" }, ["skip", "buffer-one", "allow-all", "cancel-other"].map((o) => h("option", { value: o }, o)))),
      h("button", { id: "create-schedule", onclick: create }, "Create")),
    h("div", { class: "toolbar" }, h("label", { class: "field" }, "Note", note)),
    result, problem,
    h("table", { id: "schedules" },
      h("thead", {}, h("tr", {}, ["Schedule", "Workflow", "When", "Overlap", "Next", "Fires", ""].map((c) => h("th", {}, c)))),
      body));
  await load();
  const timer = setInterval(load, 2000);
  signal.addEventListener("abort", () => clearInterval(timer));
}

// ------------------------------------------------------------------ templates

// A template's reviewed pre-approvals, one line each (docs/templates.md).
function preApprovalLine(p) {
  const shape = [p.proposalSchema ? "schema" : null, p.proposalWhen ? `when ${p.proposalWhen}` : null].filter(Boolean).join(", ");
  return h("div", { class: "pre-approval" }, `${p.actionClass} or below · ${p.approverRole} · until ${when(p.expiresAt)} · at most ${p.maxUses}${shape ? ` · ${shape}` : ""}`);
}

async function templatesPage(main, signal) {
  const body = h("tbody");
  const problem = h("div");
  const result = h("div", { id: "template-result" });
  const reason = h("input", { id: "template-reason", placeholder: "reason (decision or revocation)" });
  const act = (fn) => async () => {
    result.replaceChildren();
    try { await fn(); await load(); } catch (error) { if (error instanceof Problem) result.replaceChildren(problemBox(error.body)); else throw error; }
  };
  const why = () => (reason.value.trim() ? { reason: reason.value.trim() } : {});
  const row = (t) => {
    const url = `../factory/templates/${encodeURIComponent(t.templateId)}`;
    // The decision binds the version and content hash the reviewer saw on this row.
    const decide = (decision) => act(async () => {
      await api(`${url}/decision`, { method: "POST", body: { decision, version: t.version, contentHash: t.contentHash, ...why() } });
      result.replaceChildren(h("div", { class: "notice" }, `${t.templateId} v${t.version}: ${decision}d`));
    });
    const buttons = t.state === "Proposed"
      ? [h("button", { class: "approve", onclick: decide("approve") }, "Approve"), h("button", { class: "reject danger", onclick: decide("reject") }, "Reject")]
      : t.state === "Active"
        ? [h("button", { class: "revoke danger", onclick: act(() => api(`${url}/revocation`, { method: "POST", body: why() })) }, "Revoke")]
        : [];
    return h("tr", { dataset: { templateId: t.templateId, version: String(t.version), state: t.state } },
      h("td", { class: "mono" }, t.templateId),
      h("td", {}, `v${t.version}`),
      h("td", {}, `${t.workflowId}@${t.releaseAlias}`),
      h("td", {}, badge(t.state), t.decidedBy ? h("div", { class: "muted" }, `by ${t.decidedBy}${t.breakGlass ? " (break-glass)" : ""}`) : null),
      h("td", {}, (t.preApprovals || []).map(preApprovalLine)),
      h("td", { class: "counts" }, String(t.uses)),
      h("td", {}, t.createdBy, h("div", { class: "hash" }, t.contentHash)),
      h("td", {}, ...buttons));
  };
  const load = async () => {
    try {
      const answer = await api("../factory/templates?limit=200", { signal });
      problem.replaceChildren();
      body.replaceChildren(...(answer.items.length ? answer.items.map(row) : [h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No templates."))]));
    } catch (error) {
      if (error instanceof Problem) problem.replaceChildren(problemBox(error.body));
    }
  };
  main.replaceChildren(
    h("h1", {}, "Templates"),
    h("p", { class: "muted" }, "A template's pre-approvals decide its runs' approvals at once; approving one binds its version and content hash, and its author may not decide it."),
    h("div", { class: "toolbar" }, h("label", { class: "field" }, "Reason", reason)),
    result, problem,
    h("table", { id: "templates" },
      h("thead", {}, h("tr", {}, ["Template", "Version", "Workflow", "State", "Pre-approvals", "Uses", "Author · content hash", ""].map((c) => h("th", {}, c)))),
      body));
  await load();
  const timer = setInterval(load, 2000);
  signal.addEventListener("abort", () => clearInterval(timer));
}

// ------------------------------------------------------------------ routing

let leaving = null;

function navigate(hash) {
  if (location.hash === hash) route(); // no hashchange event for the same hash
  else location.hash = hash;
}

function showWho() {
  const who = document.getElementById("whoami");
  const out = document.getElementById("sign-out");
  const t = token();
  if (!t) {
    who.textContent = "";
    out.hidden = true;
    return;
  }
  const c = claims(t);
  const roles = Array.isArray(c.roles) ? c.roles.join(", ") : c.roles || "";
  who.textContent = `${c.sub || "?"} · ${roles} · ${c.tid || "?"}/${c.pid || "?"}`;
  out.hidden = false;
}

async function route() {
  if (leaving) leaving.abort();
  leaving = new AbortController();
  const signal = leaving.signal;
  const main = document.getElementById("main");
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query);
  showWho();
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("current", path.startsWith(link.getAttribute("href").slice(1)));
  }
  if (path === "/login" || !token()) return loginPage(main, params);
  const run = path.match(/^\/runs\/([0-9a-fA-F-]{36})$/);
  if (run) return runPage(main, run[1], signal);
  if (path === "/approvals") return approvalsPage(main, params, signal);
  if (path === "/queues") return queuesPage(main, signal);
  if (path === "/schedules") return schedulesPage(main, signal);
  if (path === "/templates") return templatesPage(main, signal);
  return runsPage(main, params, signal);
}

async function start() {
  const config = await fetch("config.json").then((r) => r.json()).catch(() => ({ oauth: null }));
  oauth = config.oauth;
  const failed = await finishSignIn().catch((error) => String(error));
  document.getElementById("sign-out").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", route);
  if (failed) navigate(`#/login?reason=${encodeURIComponent(failed)}`);
  else route();
}

start();
