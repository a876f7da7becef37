-- Migration 0018: rate limits (issue 21 item 2). A step's draws on token buckets and why it is
-- held, the buckets themselves (one row per tenant and bucket, shared by every host), and the
-- two functions that move a bucket, each one short transaction holding the bucket's row lock.
--
-- A bucket is a GCRA cell (generic cell rate algorithm): ``tat`` is its theoretical arrival
-- time. Reserving ``u`` units at rate ``r`` and burst ``b`` is admitted at
-- ``max(now, tat - (b - u) / r)`` and moves ``tat`` to ``max(tat, admitted) + u / r``; an instant
-- later than now is a reservation of the future (the step is held until then, and its dispatch
-- then takes nothing again). docs/flow-control-rates.md says why and what it costs.

-- IF NOT EXISTS: the concurrency keys (0017, branch flow) add the same visible hold.
ALTER TABLE steps ADD COLUMN IF NOT EXISTS held jsonb;
ALTER TABLE steps ADD COLUMN rate_limits jsonb;
-- The held steps' gauge (runcontrol_steps_held) counts them from this.
CREATE INDEX IF NOT EXISTS ix_steps_held ON steps (tenant_id) WHERE held IS NOT NULL;

CREATE TABLE rate_buckets (
	tenant_id TEXT NOT NULL,
	bucket TEXT NOT NULL,
	tat TIMESTAMP WITH TIME ZONE NOT NULL,
	per_second DOUBLE PRECISION NOT NULL,
	burst DOUBLE PRECISION NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	CONSTRAINT rate_buckets_pkey PRIMARY KEY (tenant_id, bucket)
);

ALTER TABLE rate_buckets ENABLE ROW LEVEL SECURITY;
ALTER TABLE rate_buckets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON rate_buckets
    USING (tenant_id = current_setting('runcontrol.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('runcontrol.tenant_id', true));
GRANT SELECT, INSERT, UPDATE ON rate_buckets TO runcontrol_app;
GRANT SELECT ON rate_buckets TO runcontrol_system;

-- Reserve every draw of one dispatch ([{bucket, perSecond, burst, units}]) at once: the rows
-- are locked in bucket order (two reservations over the same buckets never deadlock), the
-- admission is the latest any bucket allows, and every bucket is moved to it. Answers the
-- admitted instant and the bucket that decided it (null: admitted at ``at``).
CREATE FUNCTION runcontrol_rate_reserve(tenant text, draws jsonb, at timestamptz)
RETURNS TABLE (admitted_at timestamptz, decided_by text)
LANGUAGE plpgsql AS $fn$
DECLARE
    d jsonb;
    cur timestamptz;
    candidate timestamptz;
    best timestamptz := at;
    binding text;
BEGIN
    PERFORM set_config('runcontrol.tenant_id', tenant, true);
    FOR d IN SELECT value FROM jsonb_array_elements(draws) ORDER BY value->>'bucket' LOOP
        INSERT INTO rate_buckets AS b (tenant_id, bucket, tat, per_second, burst, updated_at)
        VALUES (tenant, d->>'bucket', at, (d->>'perSecond')::float8, (d->>'burst')::float8, at)
        ON CONFLICT ON CONSTRAINT rate_buckets_pkey DO UPDATE
            SET per_second = EXCLUDED.per_second, burst = EXCLUDED.burst
        RETURNING b.tat INTO cur;
        candidate := cur - make_interval(secs => ((d->>'burst')::float8 - (d->>'units')::float8)
                                                 / (d->>'perSecond')::float8);
        IF candidate > best THEN
            best := candidate;
            binding := d->>'bucket';
        END IF;
    END LOOP;
    FOR d IN SELECT value FROM jsonb_array_elements(draws) LOOP
        UPDATE rate_buckets AS b
            SET tat = greatest(b.tat, best)
                      + make_interval(secs => (d->>'units')::float8 / (d->>'perSecond')::float8),
                updated_at = at
            WHERE b.tenant_id = tenant AND b.bucket = d->>'bucket';
    END LOOP;
    RETURN QUERY SELECT best, binding;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_rate_reserve(text, jsonb, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_rate_reserve(text, jsonb, timestamptz) TO runcontrol_app;

-- Units a worker reports it used (``draw``: {bucket, perSecond, burst, units}): the bucket's
-- ``tat`` moves by units / rate from no earlier than ``at``, never refused, so the dispatches
-- after it wait. Answers the bucket's new ``tat``.
CREATE FUNCTION runcontrol_rate_consume(tenant text, draw jsonb, at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql AS $fn$
DECLARE
    step interval := make_interval(secs => (draw->>'units')::float8
                                           / (draw->>'perSecond')::float8);
    moved timestamptz;
BEGIN
    PERFORM set_config('runcontrol.tenant_id', tenant, true);
    INSERT INTO rate_buckets AS b (tenant_id, bucket, tat, per_second, burst, updated_at)
    VALUES (tenant, draw->>'bucket', at + step, (draw->>'perSecond')::float8,
            (draw->>'burst')::float8, at)
    ON CONFLICT ON CONSTRAINT rate_buckets_pkey DO UPDATE
        SET tat = greatest(b.tat, EXCLUDED.updated_at) + step,
            per_second = EXCLUDED.per_second, burst = EXCLUDED.burst,
            updated_at = EXCLUDED.updated_at
    RETURNING b.tat INTO moved;
    RETURN moved;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_rate_consume(text, jsonb, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_rate_consume(text, jsonb, timestamptz) TO runcontrol_app;
