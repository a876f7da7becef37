-- Each document applied in a subtransaction of its own (one that fails rolls back alone): the
-- answers, in order, null for a document applied or [SQLSTATE, message] for one rolled back,
-- and the places (from 1) of those applied.
CREATE OR REPLACE FUNCTION runcontrol_apply_each(
    docs jsonb, appends boolean, wake_dispatch boolean, wake_events boolean,
    OUT answers jsonb, OUT applied int[]
) LANGUAGE plpgsql AS $fn$
DECLARE
    doc jsonb;
    place int;
BEGIN
    answers := '[]'::jsonb;
    applied := '{}';
    FOR doc, place IN SELECT value, ordinality FROM jsonb_array_elements(docs) WITH ORDINALITY
    LOOP
        BEGIN
            PERFORM runcontrol_apply_document(doc, appends, wake_dispatch, wake_events);
            answers := answers || jsonb_build_array(NULL::text);
            applied := applied || place;
        EXCEPTION WHEN OTHERS THEN
            answers := answers || jsonb_build_array(jsonb_build_array(SQLSTATE, SQLERRM));
        END;
    END LOOP;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_apply_each(jsonb, boolean, boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_apply_each(jsonb, boolean, boolean, boolean)
    TO runcontrol_app;
