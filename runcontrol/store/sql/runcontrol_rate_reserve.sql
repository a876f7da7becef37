-- Rate limits (issue 21 item 2): a bucket (rate_buckets, one row per tenant and bucket,
-- shared by every host) moves by this function or runcontrol_rate_consume, each one short
-- transaction holding the bucket's row lock. A bucket is a GCRA cell (generic cell rate
-- algorithm): ``tat`` is its theoretical arrival time. Reserving ``u`` units at rate ``r`` and
-- burst ``b`` is admitted at ``max(now, tat - (b - u) / r)`` and moves ``tat`` to
-- ``max(tat, admitted) + u / r``; an instant later than now is a reservation of the future (the
-- step is held until then, and its dispatch then takes nothing again).
-- docs/flow-control-rates.md says why and what it costs.
--
-- Reserve every draw of one dispatch ([{bucket, perSecond, burst, units}]) at once: the rows
-- are locked in bucket order (two reservations over the same buckets never deadlock), the
-- admission is the latest any bucket allows, and every bucket is moved to it. Answers the
-- admitted instant and the bucket that decided it (null: admitted at ``at``).
CREATE OR REPLACE FUNCTION runcontrol_rate_reserve(tenant text, draws jsonb, at timestamptz)
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
