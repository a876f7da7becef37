-- Migration 0014: runcontrol_apply hands each table's rows to that table's writer (issue 19,
-- item 4), and a run's pins never change (invariant 2, issue 23).
--
-- The writers (runcontrol_insert_runs, runcontrol_update_runs, runcontrol_write_<table>) are
-- rendered from runcontrol/store/tables.py and frozen in 0014_writers.sql, which runs first.
-- A later migration that adds a column adds its ALTER and the one writer `make sql` renders
-- again into its own NNNN_writers.sql; this file stays as it is. What is kept here by hand is
-- what is not a column list: the run's guards (a used idempotency key, RC001; a lost version
-- race, RC409), the budget reservation (RC402) and its release, the tenant's capacity (RC429)
-- and the notifications, the middle three as small functions of their own. The document is
-- 0012's, unchanged; so are the clauses' order (rows before the rows that refer to them, the
-- capacity check after the attempts) and every error they raise. The run's update no longer
-- names its pinned columns, and the trigger runs_keep_pins (rendered beside the writers)
-- refuses their change from any statement.

-- The run's budget reservation, made by its own statement (idempotent per run). With a tenant
-- limit, the reservations of one tenant are serialised so two cannot both squeeze under it.
CREATE OR REPLACE FUNCTION runcontrol_reserve_budget(tenant text, run uuid, wanted jsonb)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    amount numeric := (wanted->>'amount_usd')::numeric;
    cap numeric := (wanted->>'limit_usd')::numeric;
    used numeric;
BEGIN
    IF cap IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext('budget:' || tenant));
        SELECT coalesce(sum(amount_usd), 0) INTO used FROM budget_reservations
            WHERE released_at IS NULL AND run_id <> run;
        IF used + amount > cap THEN
            RAISE EXCEPTION 'tenant budget exhausted: % of % USD reserved, % requested',
                round(used, 2), round(cap, 2), round(amount, 2) USING ERRCODE = 'RC402';
        END IF;
    END IF;
    INSERT INTO budget_reservations (reservation_id, tenant_id, run_id, amount_usd, created_at)
        VALUES ((wanted->>'reservation_id')::uuid, tenant, run, amount,
                (wanted->>'created_at')::timestamptz)
        ON CONFLICT (run_id) DO NOTHING;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_reserve_budget(text, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_reserve_budget(text, uuid, jsonb) TO runcontrol_app;

-- A document that dispatched under a cap on the tenant's open attempts: the check is serialised
-- per tenant and counts the document's own rows (RC429 rolls back this document only; the grain
-- decides again without the dispatch).
CREATE OR REPLACE FUNCTION runcontrol_check_capacity(tenant text, cap int)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    open_attempts bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('capacity:' || tenant));
    SELECT count(*) INTO open_attempts FROM attempts WHERE state IN ('Dispatched', 'Leased');
    IF open_attempts > cap THEN
        RAISE EXCEPTION 'tenant capacity exhausted: at most % open attempts', cap
            USING ERRCODE = 'RC429';
    END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_check_capacity(text, int) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_check_capacity(text, int) TO runcontrol_app;

-- The run's budget reservation released (its terminal transition): once.
CREATE OR REPLACE FUNCTION runcontrol_release_budget(run uuid, released timestamptz)
RETURNS void LANGUAGE sql AS $fn$
    UPDATE budget_reservations SET released_at = released WHERE run_id = run AND released_at IS NULL;
$fn$;
REVOKE ALL ON FUNCTION runcontrol_release_budget(uuid, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_release_budget(uuid, timestamptz) TO runcontrol_app;

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
    -- A command's answer and those of the grants its commit made (a fused grant: an outcome that
    -- dispatches the next step leases it to a waiting worker credit in the same transaction,
    -- its AcquireLease answer stored under the credit's claim id; DESIGN 10).
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
