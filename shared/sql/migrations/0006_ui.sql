-- cronstream projection, version 6: what the web dashboard (`cronstream ui`) needs.
-- docs/decisions/0040-web-dashboard.md.

-- "Recent terminal executions" on the Runs page, newest first, without a scan of the
-- whole table. Partial: executions still QUEUED or RUNNING have no entry, so the
-- monitor pays one index entry per execution, when it ends.
CREATE INDEX IF NOT EXISTS job_executions_completed ON job_executions (completed_at DESC)
    WHERE completed_at IS NOT NULL;

-- Live views without polling: every statement that changes job_executions notifies the
-- channel `cronstream_executions` once (same channel, same empty payload: PostgreSQL
-- folds the repeats of a transaction into one notification, delivered at commit). A
-- dashboard LISTENs and re-reads only when something changed and someone watches; when
-- nothing runs, it does no work at all.
CREATE FUNCTION cronstream_notify_executions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cronstream_executions', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER job_executions_notify
    AFTER INSERT OR UPDATE ON job_executions
    FOR EACH STATEMENT EXECUTE FUNCTION cronstream_notify_executions();
