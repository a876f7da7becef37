-- Migration 0021: runcontrol_apply writes the document's journaled calls (after
-- 0021_writers.sql).
--
-- 0017's runcontrol_apply is not restated: it is renamed runcontrol_apply_0017 and the new
-- runcontrol_apply calls it, then writes the calls. Writing them last is safe: the rows they
-- refer to (run, step, attempt) are written by then, in the same transaction. A document
-- without "calls" (every document of the previous release) is applied as before.
-- runcontrol_apply_many calls runcontrol_apply by name, so a group commit takes the new one.

ALTER FUNCTION runcontrol_apply(jsonb) RENAME TO runcontrol_apply_0017;
REVOKE ALL ON FUNCTION runcontrol_apply_0017(jsonb) FROM PUBLIC;

CREATE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    wrote boolean;
BEGIN
    PERFORM runcontrol_apply_0017(doc);
    IF doc ? 'calls' THEN wrote := runcontrol_write_journaled_calls(doc->'calls'); END IF;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO runcontrol_app;
