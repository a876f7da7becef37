-- A run template's pre-approval used (issue 44, docs/templates.md): the trigger on
-- approval_decisions (AFTER INSERT, for a template's vote: its pre_approval is set) counts the
-- use in the statement that writes the vote, only while the pre-approval's uses are under its
-- maxUses (template_uses: a row per version and pre-approval, made by its first use, its
-- max_uses the version's content's). The grain reads the uses before it decides, without a
-- lock: two runs deciding at once both read a count under the limit, and this guard keeps the
-- second from passing it (its upsert waits for the first's row and re-checks the committed
-- count). Refused: RC431, rolling back this document only; the grain decides again on fresh
-- uses, and the request waits for a human (errors.PreApprovalUsedUp).
CREATE OR REPLACE FUNCTION runcontrol_template_use() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    counted bigint;
BEGIN
    INSERT INTO template_uses AS u (template_id, version, pre_approval, tenant_id, uses,
                                    max_uses)
        SELECT t.template_id, t.version, NEW.pre_approval, t.tenant_id, 1,
               (t.content->'preApprovals'->NEW.pre_approval->>'maxUses')::int
        FROM runs AS r JOIN run_templates AS t ON t.tenant_id = r.tenant_id
            AND t.template_id = r.template_id AND t.version = r.template_version
        WHERE r.run_id = NEW.run_id
    ON CONFLICT (tenant_id, template_id, version, pre_approval)
        DO UPDATE SET uses = u.uses + 1 WHERE u.uses < u.max_uses;
    GET DIAGNOSTICS counted = ROW_COUNT;
    IF counted = 0 THEN
        RAISE EXCEPTION 'the pre-approval % of the run''s template is used up', NEW.pre_approval
            USING ERRCODE = 'RC431';
    END IF;
    RETURN NULL;
END $fn$;
REVOKE ALL ON FUNCTION runcontrol_template_use() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION runcontrol_template_use() TO runcontrol_app;
