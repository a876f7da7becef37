-- 0015: runcontrol_apply stores several command answers in one document (`answers`): the
-- command's own and those of the grants its commit made (a fused grant, DESIGN 10: an outcome
-- that dispatches the next step leases it to a waiting worker credit in the same transaction,
-- its AcquireLease answer stored under the credit's claim id, so a lost grant is found again
-- by that id). PL/pgSQL has no way to add one statement to a function, so the function is
-- restated; it is 0014's with exactly that one line added (tests/store/test_migrations.py).

CREATE OR REPLACE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    wrote boolean;  -- a writer called as an expression: no executor started per call
BEGIN
    PERFORM set_config('runcontrol.tenant_id', doc->>'tenant', true);
    -- Nested, not ANDed: SQL does not promise to evaluate the mode before the writer.
    IF doc->>'mode' = 'insert' THEN
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
    IF doc ? 'outbox' THEN wrote := runcontrol_write_outbox(doc->'outbox'); END IF;
    IF doc ? 'journal' THEN wrote := runcontrol_write_recovery_journal(doc->'journal'); END IF;
    IF doc ? 'audits' THEN wrote := runcontrol_write_audit_log(doc->'audits'); END IF;
    IF doc ? 'answer' THEN
        wrote := runcontrol_write_command_answers(jsonb_build_array(doc->'answer'));
    END IF;
    IF doc ? 'answers' THEN wrote := runcontrol_write_command_answers(doc->'answers'); END IF;
    IF doc ? 'release_budget' THEN
        PERFORM runcontrol_release_budget((doc->'run'->>'run_id')::uuid,
                                          (doc->>'release_budget')::timestamptz);
    END IF;
    -- Delivered on commit: to the claimers of each agent dispatched to, the run's watchers.
    IF doc ? 'notify_agents' THEN
        PERFORM pg_notify('runcontrol_dispatch', agent)
            FROM jsonb_array_elements_text(doc->'notify_agents') agent;
    END IF;
    PERFORM pg_notify('runcontrol_events', doc->>'notify_run') WHERE doc ? 'notify_run';
END $fn$;
