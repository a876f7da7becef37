-- Units a worker reports it used (``draw``: {bucket, perSecond, burst, units}): the bucket's
-- ``tat`` moves by units / rate from no earlier than ``at``, never refused, so the dispatches
-- after it wait. Answers the bucket's new ``tat``.
CREATE OR REPLACE FUNCTION runcontrol_rate_consume(tenant text, draw jsonb, at timestamptz)
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
