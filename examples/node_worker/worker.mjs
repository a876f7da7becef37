// One attempt through runcontrol's gRPC worker surface, without Python (docs/workers.md,
// "Other languages"): Exchange with a credit -> grant; ReportProgress; ClaimToolCall and
// CompleteToolCall; RequestApproval (the attempt parks until a reviewer approves, then comes
// back as a new grant carrying the approved hash); ReportAttemptOutcome with a result.
//
//   npm install && node worker.mjs            (RC_GRPC=127.0.0.1:9000 WORKER_TOKEN=... AGENT=...)
import { createHash, randomUUID } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const here = dirname(fileURLToPath(import.meta.url));
const root = process.env.RC_ROOT || join(here, "../.."); // the checkout: schemas/runcontrol.proto
const definition = protoLoader.loadSync(join(root, "schemas/runcontrol.proto"), {
  keepCase: true, longs: Number, enums: String, defaults: true, includeDirs: [root],
});
const { RunControl } = grpc.loadPackageDefinition(definition).runcontrol.v1;
const client = new RunControl(process.env.RC_GRPC || "127.0.0.1:9000", grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
metadata.set("authorization", `Bearer ${process.env.WORKER_TOKEN}`);
const agent = process.env.AGENT || "node-agent";
const instance = "node-1"; // with the token's subject: the lease holder "sub/node-1"

// Canonical JSON (sorted keys, no spaces) and its hash: what the server hashes, for the plain
// strings, integers, booleans, arrays and objects this example sends.
const canonical = (v) =>
  Array.isArray(v) ? `[${v.map(canonical).join(",")}]`
  : v && typeof v === "object"
    ? `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`
    : JSON.stringify(v);
const hash = (v) => "sha256:" + createHash("sha256").update(canonical(v), "utf8").digest("hex");
const call = (method, request) =>
  new Promise((resolve, reject) =>
    client[method](request, metadata, { deadline: Date.now() + 40_000 }, (err, reply) =>
      err ? reject(err) : resolve(reply)));

// 1. Exchange: offer one credit (a free slot) for the agent; long-poll until a grant comes.
const session = randomUUID();
const { hosts } = await call("Exchange", {}); // an empty session id answers the host count
async function grant() {
  const claim = randomUUID(); // a new credit: its claim id is the command id of its lease
  for (;;) {
    for (let host = 0; host < hosts; host++) {
      const credit = { claim_id: claim, worker_instance_id: instance, agent_ids: [agent] };
      const down = await call("Exchange", {
        host, session_id: session, credits: [credit], wait_seconds: 10 / hosts,
      });
      if (down.grants.length) {
        await call("Exchange", { host, session_id: session, acks: [claim] }); // got it
        return down.grants[0];
      }
    }
  }
}
let { lease, results_json } = await grant();
const fenced = () => ({
  run_id: lease.run_id, attempt_id: lease.attempt_id, lease_id: lease.lease_id,
  fencing_token: lease.fencing_token, worker_instance_id: instance,
});
console.log(`granted attempt ${lease.attempt_id} of run ${lease.run_id}`);
console.log(`input ${lease.input_json}; dependencies' results ${results_json || "{}"}`);

// 2. Progress: numbered per attempt from 1; a resend of a number is dropped.
await call("ReportProgress", {
  ...fenced(), command_id: randomUUID(), messages: [{ seq: 1, text: "started in Node" }],
});

// 3. A tool call: claim it before the side effect; run it only on "proceed".
const request = { tool: "word-count", text: lease.input_json };
const claimed = await call("ClaimToolCall", {
  ...fenced(), command_id: randomUUID(), call_id: "word-count", request_hash: hash(request),
});
let words;
if (claimed.status === "proceed") {
  words = lease.input_json.split(/\W+/).filter(Boolean).length; // the side effect
  await call("CompleteToolCall", {
    ...fenced(), command_id: randomUUID(), call_id: "word-count", result_hash: hash({ words }),
  });
}

// 4. Approval of an exact proposal (its hash). Required: the attempt parks (no slot held);
//    once a reviewer approves, it comes back as a new grant with approved_proposal_hash set.
const proposal = { action: "publish", words: words ?? null };
if (lease.approved_proposal_hash !== hash(proposal)) {
  const asked = await call("RequestApproval", {
    ...fenced(), command_id: randomUUID(), proposal_hash: hash(proposal),
  });
  if (asked.required) {
    console.log(`approval ${asked.approval.approval_id} pending for ${hash(proposal)}: decide it`);
    ({ lease } = await grant()); // the resumed attempt, granted to a new credit
  }
}

// 5. The outcome with its result: the server stores the result and hashes it (outcomeHash).
const result = { summary: `counted ${words} words`, by: "node" };
const { attempt } = await call("ReportAttemptOutcome", {
  ...fenced(), command_id: randomUUID(), outcome: "SUCCEEDED", result_json: canonical(result),
});
console.log(`attempt ${attempt.state}; outcomeHash ${attempt.outcome_hash} (ours ${hash(result)})`);
client.close();
