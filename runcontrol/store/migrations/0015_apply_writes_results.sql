-- Migration 0015: runcontrol_apply writes the document's results (after 0015_writers.sql).
--
-- 0014's runcontrol_apply is not restated: it is renamed runcontrol_apply_0014 and the new
-- runcontrol_apply calls it, then writes the results. Writing them last is safe: the rows they
-- refer to (run, step, attempt) are written by then, in the same transaction, and the
-- notifications are delivered on commit whatever their order. runcontrol_apply_many
-- calls runcontrol_apply by name, so a group commit takes the new one.

ALTER FUNCTION runcontrol_apply(jsonb) RENAME TO runcontrol_apply_0014;
REVOKE ALL ON FUNCTION runcontrol_apply_0014(jsonb) FROM PUBLIC;

CREATE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    wrote boolean;
BEGIN
    PERFORM runcontrol_apply_0014(doc);
    IF doc ? 'results' THEN wrote := runcontrol_write_attempt_results(doc->'results'); END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO runcontrol_app;
