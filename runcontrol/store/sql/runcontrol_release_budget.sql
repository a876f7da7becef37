-- The run's budget reservation released (its terminal transition): once.
CREATE OR REPLACE FUNCTION runcontrol_release_budget(run uuid, released timestamptz)
RETURNS void LANGUAGE sql AS $fn$
    UPDATE budget_reservations SET released_at = released WHERE run_id = run AND released_at IS NULL;
$fn$;
REVOKE ALL ON FUNCTION runcontrol_release_budget(uuid, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_release_budget(uuid, timestamptz) TO runcontrol_app;
