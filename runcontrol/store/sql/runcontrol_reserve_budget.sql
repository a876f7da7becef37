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
