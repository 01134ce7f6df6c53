-- cronstream projection, version 4: decisions taken once, whatever the number of monitors.

-- The first APPROVE, REJECT or CANCEL of an execution waiting for approval wins; a
-- second one (or the same one re-projected after a crash) finds the row and does nothing.
CREATE TABLE execution_decisions (
    execution_id uuid PRIMARY KEY,
    decision     text NOT NULL,          -- APPROVE, REJECT, CANCEL
    decided_by   text,
    decided_at   timestamptz NOT NULL DEFAULT now()
);

-- Failed attempts of a job, newest first: where a pending retry is found to cancel it.
CREATE INDEX job_executions_retryable ON job_executions (job_id, completed_at DESC)
    WHERE status IN ('FAILED', 'TIMED_OUT');

-- The W3C traceparent of each execution's latest event: a requeue or an approval
-- continues the execution's trace from it (job_executions.trace_id is its trace id).
ALTER TABLE job_executions ADD COLUMN traceparent text;
