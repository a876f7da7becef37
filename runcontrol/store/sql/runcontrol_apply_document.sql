-- One document applied: the one statement a transition's commit runs (per document of a group
-- commit: runcontrol_apply_many; alone: runcontrol_apply), as the caller (SECURITY INVOKER:
-- row-level security, the grants and the triggers apply).
--
-- Each table's rows go to that table's writer, rendered from runcontrol/store/tables.py
-- (store/writers.py: runcontrol_insert_runs, runcontrol_update_runs, runcontrol_patch_runs,
-- runcontrol_write_<table>); a new column changes its writer, not this function. What is kept
-- here by hand is what is not a column list: the run's guards (a used idempotency key, RC001;
-- a lost version race, RC409), the budget reservation (RC402) and its release, the tenant's
-- capacity (RC429), the flow-control slots and queues (RC430), and the wake-ups. The clauses
-- come in one order: rows before the rows that refer to them, the capacity check after the
-- attempts, the results and journaled calls after the run, step and attempt they refer to.
--
-- The run: "insert" (a new run), "update" (a whole row, version-guarded) or "patch" (only the
-- columns the document carries, version-guarded: an unchanged input is not sent, parsed or
-- written again). The append-only rows (outbox, journal, answers, results, audits) are written
-- only when told to (appends): a group commit appends those of all its documents at once once
-- they have applied (runcontrol_append_rows). It sends the wake-ups it is told somebody
-- hears (runcontrol_listened); "notify_run" and "notify_agents" (older documents) NOTIFY
-- always.
CREATE OR REPLACE FUNCTION runcontrol_apply_document(
    doc jsonb, appends boolean, wake_dispatch boolean, wake_events boolean
) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    wrote boolean;  -- a writer called as an expression: no executor started per call
BEGIN
    PERFORM set_config('runcontrol.tenant_id', doc->>'tenant', true);
    PERFORM runcontrol_check_fence(doc->>'tenant');  -- a moved tenant's: RC421 (issue 41)
    -- Nested, not ANDed: SQL does not promise to evaluate the mode before the writer.
    IF doc->>'mode' = 'patch' THEN
        IF NOT runcontrol_patch_runs(doc->'run', (doc->>'expected_version')::bigint) THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    ELSIF doc->>'mode' = 'insert' THEN
        IF NOT runcontrol_insert_runs(doc->'run') THEN
            RAISE EXCEPTION 'the idempotency key already names a run' USING ERRCODE = 'RC001';
        END IF;
    ELSIF doc->>'mode' = 'update' THEN
        IF NOT runcontrol_update_runs(doc->'run', (doc->>'expected_version')::bigint) THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    END IF;
    IF doc ? 'reserve' THEN
        PERFORM runcontrol_reserve_budget(doc->>'tenant', (doc->'run'->>'run_id')::uuid,
                                          doc->'reserve');
    END IF;
    IF doc ? 'steps' THEN wrote := runcontrol_write_steps(doc->'steps'); END IF;
    IF doc ? 'attempts' THEN wrote := runcontrol_write_attempts(doc->'attempts'); END IF;
    IF doc ? 'capacity' THEN
        PERFORM runcontrol_check_capacity(doc->>'tenant', (doc->>'capacity')::int);
    END IF;
    IF doc ? 'leases' THEN wrote := runcontrol_write_leases(doc->'leases'); END IF;
    IF doc ? 'tool_calls' THEN wrote := runcontrol_write_tool_calls(doc->'tool_calls'); END IF;
    IF doc ? 'approvals' THEN
        wrote := runcontrol_write_approval_requests(doc->'approvals');
    END IF;
    IF doc ? 'decisions' THEN
        wrote := runcontrol_write_approval_decisions(doc->'decisions');
    END IF;
    IF doc ? 'intents' THEN
        wrote := runcontrol_write_cancellation_intents(doc->'intents');
    END IF;
    IF appends THEN
        IF doc ? 'outbox' THEN wrote := runcontrol_write_outbox(doc->'outbox'); END IF;
        IF doc ? 'journal' THEN
            wrote := runcontrol_write_recovery_journal(doc->'journal');
        END IF;
        IF doc ? 'audits' THEN wrote := runcontrol_write_audit_log(doc->'audits'); END IF;
        IF doc ? 'answer' THEN
            wrote := runcontrol_write_command_answers(jsonb_build_array(doc->'answer'));
        END IF;
        IF doc ? 'answers' THEN
            wrote := runcontrol_write_command_answers(doc->'answers');
        END IF;
    END IF;
    IF doc ? 'release_budget' THEN
        PERFORM runcontrol_release_budget((doc->'run'->>'run_id')::uuid,
                                          (doc->>'release_budget')::timestamptz);
    END IF;
    -- "notify_agents", "notify_run" (and the mode "update"): documents written before
    -- issue 33, which NOTIFY whether or not anybody listens.
    IF doc ? 'notify_agents' THEN
        PERFORM pg_notify('runcontrol_dispatch', agent)
            FROM jsonb_array_elements_text(doc->'notify_agents') agent;
    END IF;
    IF doc ? 'notify_run' THEN
        PERFORM pg_notify('runcontrol_events', doc->>'notify_run');
    END IF;
    -- The results and journaled calls after the run, step and attempt they refer to.
    IF appends AND doc ? 'results' THEN
        wrote := runcontrol_write_attempt_results(doc->'results');
    END IF;
    IF doc ? 'flow' THEN PERFORM runcontrol_flow_admit(doc->>'tenant', doc->'flow'); END IF;
    IF doc ? 'flow_wait' THEN  -- held steps queued, after the slots this document took
        PERFORM runcontrol_flow_wait(doc->>'tenant', doc->'flow_wait');
    END IF;
    -- A run with held steps rewrote its reminder from its cache, which cannot know that one
    -- of them was promoted meanwhile: keep the promotion's "due now".
    IF doc ? 'flow_held' THEN
        UPDATE runs AS r SET next_due_at = LEAST(coalesce(r.next_due_at, now()), now())
            WHERE r.run_id = (doc->'run'->>'run_id')::uuid
              AND EXISTS (SELECT 1 FROM flow_waiters w
                          WHERE w.run_id = (doc->'run'->>'run_id')::uuid AND w.promoted);
    END IF;
    IF doc ? 'calls' THEN wrote := runcontrol_write_journaled_calls(doc->'calls'); END IF;
    -- The wake-ups, each only to a channel somebody listens on (runcontrol_listen).
    IF wake_dispatch AND doc ? 'wake_agents' THEN
        PERFORM pg_notify('runcontrol_dispatch', agent)
            FROM jsonb_array_elements_text(doc->'wake_agents') agent;
    END IF;
    IF wake_events AND doc ? 'wake_run' THEN
        PERFORM pg_notify('runcontrol_events', doc->>'wake_run');
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply_document(jsonb, boolean, boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply_document(jsonb, boolean, boolean, boolean)
    TO runcontrol_app;
