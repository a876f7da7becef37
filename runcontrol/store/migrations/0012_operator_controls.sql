-- Migration 0012: operator controls (issue 14, item 1).
--
-- runs.suspended_at: set while an operator holds the run suspended (no new dispatch and no new
-- lease; leases in hand may finish and report); NULL otherwise. The claim query skips the
-- dispatched attempts of suspended runs, so a suspended run's attempt never crowds out
-- another run's.
-- runs.rerun_of: the finished run this run reruns (same input; the pinned or the current
-- release), NULL for an ordinary submission. Not a foreign key: a run is never deleted, and the
-- link is a record, not a constraint on the old run's rows.
-- runcontrol_apply is restated whole: 0009's function with both columns in the run's insert
-- and update.

ALTER TABLE runs ADD COLUMN suspended_at TIMESTAMP WITH TIME ZONE;
ALTER TABLE runs ADD COLUMN rerun_of UUID;

CREATE OR REPLACE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    used numeric;
BEGIN
    PERFORM set_config('runcontrol.tenant_id', doc->>'tenant', true);
    IF doc->>'mode' = 'insert' THEN
        INSERT INTO runs (run_id, tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id, release_hash, policy_id, policy_revision, model_profile_id, state, input_hash, snapshot_id, budget_reservation_id, requested_by, max_cost_usd, max_minutes, deadline_at, failure_class, failure_reason, outcome_hash, correlation_id, input, version, event_seq, journal_seq, fencing_seq, next_due_at, created_at, updated_at, suspended_at, rerun_of)
            SELECT run_id, tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id, release_hash, policy_id, policy_revision, model_profile_id, state, input_hash, snapshot_id, budget_reservation_id, requested_by, max_cost_usd, max_minutes, deadline_at, failure_class, failure_reason, outcome_hash, correlation_id, input, version, event_seq, journal_seq, fencing_seq, next_due_at, created_at, updated_at, suspended_at, rerun_of FROM jsonb_populate_record(NULL::runs, doc->'run')
            ON CONFLICT (tenant_id, project_id, idempotency_key) DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the idempotency key already names a run' USING ERRCODE = 'RC001';
        END IF;
    ELSIF doc->>'mode' = 'update' THEN
        UPDATE runs SET tenant_id = r.tenant_id, project_id = r.project_id, environment_id = r.environment_id, idempotency_key = r.idempotency_key, workflow_id = r.workflow_id, release_id = r.release_id, release_hash = r.release_hash, policy_id = r.policy_id, policy_revision = r.policy_revision, model_profile_id = r.model_profile_id, state = r.state, input_hash = r.input_hash, snapshot_id = r.snapshot_id, budget_reservation_id = r.budget_reservation_id, requested_by = r.requested_by, max_cost_usd = r.max_cost_usd, max_minutes = r.max_minutes, deadline_at = r.deadline_at, failure_class = r.failure_class, failure_reason = r.failure_reason, outcome_hash = r.outcome_hash, correlation_id = r.correlation_id, input = r.input, version = r.version, event_seq = r.event_seq, journal_seq = r.journal_seq, fencing_seq = r.fencing_seq, next_due_at = r.next_due_at, created_at = r.created_at, updated_at = r.updated_at, suspended_at = r.suspended_at, rerun_of = r.rerun_of
            FROM jsonb_populate_record(NULL::runs, doc->'run') r
            WHERE runs.run_id = r.run_id AND runs.version = (doc->>'expected_version')::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    END IF;
    IF doc ? 'reserve' THEN
        -- The run's budget reservation, made by its own statement (idempotent per run). With a
        -- tenant limit, reservations of one tenant are serialised so two cannot both squeeze
        -- under it; a refusal (RC402) rolls back this document only.
        IF doc->'reserve'->>'limit_usd' IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(hashtext('budget:' || (doc->>'tenant')));
            SELECT coalesce(sum(amount_usd), 0) INTO used FROM budget_reservations
                WHERE released_at IS NULL AND run_id <> (doc->'run'->>'run_id')::uuid;
            IF used + (doc->'reserve'->>'amount_usd')::numeric
                    > (doc->'reserve'->>'limit_usd')::numeric THEN
                RAISE EXCEPTION 'tenant budget exhausted: % of % USD reserved, % requested',
                    round(used, 2), round((doc->'reserve'->>'limit_usd')::numeric, 2),
                    round((doc->'reserve'->>'amount_usd')::numeric, 2)
                    USING ERRCODE = 'RC402';
            END IF;
        END IF;
        INSERT INTO budget_reservations (reservation_id, tenant_id, run_id, amount_usd, created_at)
            VALUES ((doc->'reserve'->>'reservation_id')::uuid, doc->>'tenant',
                    (doc->'run'->>'run_id')::uuid, (doc->'reserve'->>'amount_usd')::numeric,
                    (doc->'reserve'->>'created_at')::timestamptz)
            ON CONFLICT (run_id) DO NOTHING;
    END IF;
    IF doc ? 'steps' THEN
        INSERT INTO steps (step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts, gate, side_effect_class, not_before, failure_class, outcome_hash)
            SELECT step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts, gate, side_effect_class, not_before, failure_class, outcome_hash FROM jsonb_populate_recordset(NULL::steps, doc->'steps')
            ON CONFLICT (step_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, ordinal = EXCLUDED.ordinal, name = EXCLUDED.name, agent_id = EXCLUDED.agent_id, skill_id = EXCLUDED.skill_id, state = EXCLUDED.state, max_attempts = EXCLUDED.max_attempts, gate = EXCLUDED.gate, side_effect_class = EXCLUDED.side_effect_class, not_before = EXCLUDED.not_before, failure_class = EXCLUDED.failure_class, outcome_hash = EXCLUDED.outcome_hash;
    END IF;
    IF doc ? 'attempts' THEN
        INSERT INTO attempts (attempt_id, tenant_id, step_id, run_id, agent_id, number, state, lease_id, fencing_token, holder, outcome, outcome_hash, failure_class, dispatched_at, settled_at, settled_by, progress_seq)
            SELECT attempt_id, tenant_id, step_id, run_id, agent_id, number, state, lease_id, fencing_token, holder, outcome, outcome_hash, failure_class, dispatched_at, settled_at, settled_by, progress_seq FROM jsonb_populate_recordset(NULL::attempts, doc->'attempts')
            ON CONFLICT (attempt_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, step_id = EXCLUDED.step_id, run_id = EXCLUDED.run_id, agent_id = EXCLUDED.agent_id, number = EXCLUDED.number, state = EXCLUDED.state, lease_id = EXCLUDED.lease_id, fencing_token = EXCLUDED.fencing_token, holder = EXCLUDED.holder, outcome = EXCLUDED.outcome, outcome_hash = EXCLUDED.outcome_hash, failure_class = EXCLUDED.failure_class, dispatched_at = EXCLUDED.dispatched_at, settled_at = EXCLUDED.settled_at, settled_by = EXCLUDED.settled_by, progress_seq = EXCLUDED.progress_seq;
    END IF;
    IF doc ? 'capacity' THEN
        -- This document dispatched an attempt and the tenant's open attempts are capped: the
        -- check is serialised per tenant and counts this document's own rows (RC429 rolls back
        -- this document only; the grain decides again without the dispatch).
        PERFORM pg_advisory_xact_lock(hashtext('capacity:' || (doc->>'tenant')));
        IF (SELECT count(*) FROM attempts WHERE state IN ('Dispatched', 'Leased'))
                > (doc->>'capacity')::int THEN
            RAISE EXCEPTION 'tenant capacity exhausted: at most % open attempts',
                doc->>'capacity' USING ERRCODE = 'RC429';
        END IF;
    END IF;
    IF doc ? 'leases' THEN
        INSERT INTO leases (lease_id, tenant_id, attempt_id, run_id, holder, fencing_token, granted_at, expires_at, released_at, release_cause)
            SELECT lease_id, tenant_id, attempt_id, run_id, holder, fencing_token, granted_at, expires_at, released_at, release_cause FROM jsonb_populate_recordset(NULL::leases, doc->'leases')
            ON CONFLICT (lease_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, attempt_id = EXCLUDED.attempt_id, run_id = EXCLUDED.run_id, holder = EXCLUDED.holder, fencing_token = EXCLUDED.fencing_token, granted_at = EXCLUDED.granted_at, expires_at = EXCLUDED.expires_at, released_at = EXCLUDED.released_at, release_cause = EXCLUDED.release_cause;
    END IF;
    IF doc ? 'tool_calls' THEN
        INSERT INTO tool_calls (tool_call_id, tenant_id, run_id, call_id, attempt_id, request_hash, claimed_by, fencing_token, claimed_at, expires_at, state, result_hash, completed_at, error)
            SELECT tool_call_id, tenant_id, run_id, call_id, attempt_id, request_hash, claimed_by, fencing_token, claimed_at, expires_at, state, result_hash, completed_at, error FROM jsonb_populate_recordset(NULL::tool_calls, doc->'tool_calls')
            ON CONFLICT (tool_call_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, call_id = EXCLUDED.call_id, attempt_id = EXCLUDED.attempt_id, request_hash = EXCLUDED.request_hash, claimed_by = EXCLUDED.claimed_by, fencing_token = EXCLUDED.fencing_token, claimed_at = EXCLUDED.claimed_at, expires_at = EXCLUDED.expires_at, state = EXCLUDED.state, result_hash = EXCLUDED.result_hash, completed_at = EXCLUDED.completed_at, error = EXCLUDED.error;
    END IF;
    IF doc ? 'approvals' THEN
        INSERT INTO approval_requests (approval_id, tenant_id, run_id, step_id, attempt_id, action_class, proposal_hash, policy_revision, approver_rule, required_approvals, requested_by, created_at, expires_at, state, decided_by, decided_at, reason, version)
            SELECT approval_id, tenant_id, run_id, step_id, attempt_id, action_class, proposal_hash, policy_revision, approver_rule, required_approvals, requested_by, created_at, expires_at, state, decided_by, decided_at, reason, version FROM jsonb_populate_recordset(NULL::approval_requests, doc->'approvals')
            ON CONFLICT (approval_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, run_id = EXCLUDED.run_id, step_id = EXCLUDED.step_id, attempt_id = EXCLUDED.attempt_id, action_class = EXCLUDED.action_class, proposal_hash = EXCLUDED.proposal_hash, policy_revision = EXCLUDED.policy_revision, approver_rule = EXCLUDED.approver_rule, required_approvals = EXCLUDED.required_approvals, requested_by = EXCLUDED.requested_by, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, state = EXCLUDED.state, decided_by = EXCLUDED.decided_by, decided_at = EXCLUDED.decided_at, reason = EXCLUDED.reason, version = EXCLUDED.version;
    END IF;
    IF doc ? 'decisions' THEN
        INSERT INTO approval_decisions (approval_id, decided_by, tenant_id, run_id, decision, proposal_hash, reason, break_glass, decided_at)
            SELECT approval_id, decided_by, tenant_id, run_id, decision, proposal_hash, reason, break_glass, decided_at FROM jsonb_populate_recordset(NULL::approval_decisions, doc->'decisions');
    END IF;
    IF doc ? 'intents' THEN
        INSERT INTO cancellation_intents (intent_id, tenant_id, run_id, requested_by, reason, requested_at)
            SELECT intent_id, tenant_id, run_id, requested_by, reason, requested_at FROM jsonb_populate_recordset(NULL::cancellation_intents, doc->'intents');
    END IF;
    IF doc ? 'outbox' THEN
        INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic, event_type, step_id, attempt_id, correlation_id, causation_id, producer, schema_version, payload, occurred_at, published_at)
            SELECT event_id, tenant_id, project_id, run_id, seq, topic, event_type, step_id, attempt_id, correlation_id, causation_id, producer, schema_version, payload, occurred_at, published_at FROM jsonb_populate_recordset(NULL::outbox, doc->'outbox');
    END IF;

    IF doc ? 'journal' THEN
        INSERT INTO recovery_journal (tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor, occurred_at)
            SELECT tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor, occurred_at FROM jsonb_populate_recordset(NULL::recovery_journal, doc->'journal');
    END IF;
    IF doc ? 'audits' THEN
        INSERT INTO audit_log (tenant_id, run_id, kind, actor, detail, occurred_at)
            SELECT tenant_id, run_id, kind, actor, detail, occurred_at FROM jsonb_populate_recordset(NULL::audit_log, doc->'audits');
    END IF;
    IF doc ? 'answer' THEN
        INSERT INTO command_answers (tenant_id, run_id, command_id, command, answer, created_at, fingerprint)
            SELECT tenant_id, run_id, command_id, command, answer, created_at, fingerprint
            FROM jsonb_populate_record(NULL::command_answers, doc->'answer');
    END IF;
    IF doc ? 'release_budget' THEN
        UPDATE budget_reservations SET released_at = (doc->>'release_budget')::timestamptz
            WHERE run_id = (doc->'run'->>'run_id')::uuid AND released_at IS NULL;
    END IF;
    IF doc ? 'notify_agents' THEN
        PERFORM pg_notify('runcontrol_dispatch', a)
            FROM jsonb_array_elements_text(doc->'notify_agents') a;
    END IF;
    IF doc ? 'notify_run' THEN
        PERFORM pg_notify('runcontrol_events', doc->>'notify_run');
    END IF;
END $fn$;
