-- cronstream projection, version 7: execution logs (docs/reference/operations.md#execution-logs; docs/decisions/0028).

-- Every line a handler wrote, per delivery of an execution, numbered from 0 by the worker
-- (a batch projected twice adds nothing: the key). `projected_at` is when the monitor
-- wrote the line (inside its batch's transaction, which commits moments later): minus
-- `at`, the delay from `print` to readable.
CREATE TABLE execution_logs (
    execution_id uuid NOT NULL,
    delivery integer NOT NULL,
    seq integer NOT NULL,
    job_id text NOT NULL,
    attempt_number integer NOT NULL,
    at timestamptz NOT NULL,
    stream text NOT NULL,
    level text,
    line text NOT NULL,
    worker_id text,
    trace_id text,
    projected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (execution_id, delivery, seq)
);

-- The end of a delivery's log: the worker reported the execution's end with its last
-- batch, so nothing follows (`cronstream logs -f` stops waiting). A handler that wrote
-- nothing has no log and no end.
CREATE TABLE execution_log_ends (
    execution_id uuid NOT NULL,
    delivery integer NOT NULL,
    lines integer NOT NULL,
    ended_at timestamptz NOT NULL,
    PRIMARY KEY (execution_id, delivery)
);

-- Live views of a log (the dashboard's execution page, `cronstream logs -f`) wake on this
-- channel, once per transaction that wrote lines, as the runs page does on
-- `cronstream_executions` (migration 6).
CREATE FUNCTION cronstream_notify_logs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cronstream_logs', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER execution_logs_notify
    AFTER INSERT ON execution_logs
    FOR EACH STATEMENT EXECUTE FUNCTION cronstream_notify_logs();

CREATE TRIGGER execution_log_ends_notify
    AFTER INSERT ON execution_log_ends
    FOR EACH STATEMENT EXECUTE FUNCTION cronstream_notify_logs();
