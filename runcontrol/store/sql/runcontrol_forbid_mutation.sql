-- The append-only tables refuse UPDATE, DELETE and TRUNCATE, even to the owner; the one
-- sanctioned removal is the journal's retention purge (runcontrol_purge_journal).
CREATE OR REPLACE FUNCTION runcontrol_forbid_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND current_setting('runcontrol.retention_purge', true) = 'on'
       AND current_user = (SELECT tableowner FROM pg_tables
                           WHERE schemaname = TG_TABLE_SCHEMA
                             AND tablename = TG_TABLE_NAME) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;

